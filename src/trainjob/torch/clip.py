"""Gradient-norm clipping that measures the global norm when gradients are sharded (FSDP2, tensor parallel).

Under FSDP each rank holds a shard of every gradient; the norm of the local shards is not the model's gradient
norm. Gradients that are DTensors are grouped by device mesh; each group's norm is reduced over its mesh once,
then the groups are combined, so every rank scales by the same, true, global norm::

    total_norm = clip_grad_norm_(model, max_norm=1.0)
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["clip_grad_norm_", "grad_norm"]


def _grads(parameters: nn.Module | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    params = parameters.parameters() if isinstance(parameters, nn.Module) else parameters
    return [p.grad for p in params if p.grad is not None]


def grad_norm(parameters: nn.Module | Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The global ``norm_type``-norm of all gradients, identical on every rank (a float32 scalar tensor)."""
    from torch.distributed.tensor import DTensor

    grads = _grads(parameters)
    if not grads:
        return torch.tensor(0.0)
    groups: dict[object, list[torch.Tensor]] = {}
    for grad in grads:
        key = grad.device_mesh if isinstance(grad, DTensor) else None
        groups.setdefault(key, []).append(grad)
    norms = []
    for mesh, members in groups.items():
        norm = torch.nn.utils.get_total_norm(members, norm_type)
        if mesh is not None:
            norm = norm.full_tensor()  # reduces the partial norms over the mesh
        norms.append(norm.float())
    device = norms[0].device
    return torch.nn.utils.get_total_norm([n.to(device) for n in norms], norm_type)


def clip_grad_norm_(
    parameters: nn.Module | Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """Scale gradients in place so their global norm is at most ``max_norm``; return the norm before clipping.

    With an fp16 ``GradScaler``, call ``scaler.unscale_(optimizer)`` first::

        clip_grad_norm_(model, 1.0)
    """
    params = list(parameters.parameters() if isinstance(parameters, nn.Module) else parameters)
    total = grad_norm(params, norm_type)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
