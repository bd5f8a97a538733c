"""Gradient-norm clipping that measures the global norm when gradients are sharded or split into pipeline stages.

Under FSDP each rank holds a shard of every gradient and under tensor parallelism a slice of some; the norm of
the local pieces is not the model's gradient norm. Gradients that are DTensors are grouped by device mesh and each
group's norm is reduced over its mesh once; on a model that holds one pipeline stage (a model from
``parallelize`` with ``pp > 1`` names the other stages' ranks in ``pipeline_group``) the stages' norms are
combined too. Every rank then scales by the same, true, global norm, for any model ``prepare_model`` returns::

    total_norm = clip_grad_norm_(model, max_norm=1.0)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["clip_grad_norm_", "grad_norm"]

Parameters = nn.Module | Iterable[torch.Tensor]


def _mesh_of(tensor: torch.Tensor) -> object:
    dtensor = sys.modules.get("torch.distributed.tensor")  # not loaded (about 1 s to import): no DTensor exists
    return tensor.device_mesh if dtensor is not None and isinstance(tensor, dtensor.DTensor) else None


def _with_grads(parameters: Parameters) -> list[torch.Tensor]:
    params = parameters.parameters() if isinstance(parameters, nn.Module) else parameters
    return [p for p in params if p.grad is not None]


def _pipeline_group(parameters: Parameters) -> dist.ProcessGroup | None:
    return getattr(parameters, "pipeline_group", None) if isinstance(parameters, nn.Module) else None


def _norm_of(
    params: list[torch.Tensor], norm_type: float, pipeline_group: dist.ProcessGroup | None
) -> torch.Tensor:
    groups: dict[object, list[torch.Tensor]] = {}
    for param in params:
        groups.setdefault(_mesh_of(param.grad), []).append(param.grad)
    norms = []
    for mesh, grads in groups.items():
        norm = torch.nn.utils.get_total_norm(grads, norm_type)
        if mesh is not None:
            norm = norm.full_tensor()  # reduces the partial norms over the mesh
        norms.append(norm.float())
    if not norms:
        total = torch.tensor(0.0)
    else:
        total = torch.nn.utils.get_total_norm([n.to(norms[0].device) for n in norms], norm_type)
    if pipeline_group is None:
        return total
    from trainjob.torch.env import init

    total = total.to(init().device)
    if math.isinf(norm_type):
        dist.all_reduce(total, op=dist.ReduceOp.MAX, group=pipeline_group)
        return total
    total = total**norm_type
    dist.all_reduce(total, group=pipeline_group)
    return total ** (1.0 / norm_type)


def grad_norm(parameters: Parameters, norm_type: float = 2.0) -> torch.Tensor:
    """The global ``norm_type``-norm of all gradients, identical on every rank (a float32 scalar tensor)::

    norm = grad_norm(model)
    """
    return _norm_of(_with_grads(parameters), norm_type, _pipeline_group(parameters))


def clip_grad_norm_(parameters: Parameters, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Scale gradients in place so their global norm is at most ``max_norm``; return the norm before clipping.

    Pass the model itself, not ``model.parameters()``, when it may be pipeline parallel: the other stages' ranks
    are found on it. With an fp16 ``GradScaler``, call ``scaler.unscale_(optimizer)`` first::

        clip_grad_norm_(model, 1.0)
    """
    params = _with_grads(parameters)
    total = _norm_of(params, norm_type, _pipeline_group(parameters))
    if not params:
        return total
    coefficient = (max_norm / (total + 1e-6)).clamp(max=1.0)
    # Scaling is elementwise, so each rank scales its local pieces of sharded (DTensor) gradients: one plain
    # foreach call per device and dtype, with no DTensor dispatch and no host synchronisation.
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for param in params:
        grad = param.grad.to_local() if _mesh_of(param.grad) is not None else param.grad
        groups.setdefault((grad.device, grad.dtype), []).append(grad)
    for (device, _dtype), grads in groups.items():
        torch._foreach_mul_(grads, coefficient.to(device))
    return total
