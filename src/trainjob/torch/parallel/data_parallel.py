"""Data parallelism over the ``(dp_replicate, dp_shard)`` mesh with FSDP2, DDP, and activation checkpointing.

ZeRO stages map onto PyTorch like this (``dp_shard`` ranks shard, ``dp_replicate`` ranks hold copies: HSDP):

=====  ==============================  ============================================================================
stage  DeepSpeed shards                 here
=====  ==============================  ============================================================================
0      nothing                          ``DistributedDataParallel`` (needs ``tp == 1`` and one of the dp sizes 1)
1      optimizer state                  as stage 2: ``fully_shard(reshard_after_forward=False)``; FSDP2 always
                                        reduce-scatters gradients, so gradients are sharded too at no extra traffic
2      optimizer state, gradients       ``fully_shard(reshard_after_forward=False)``: parameters gathered once per
                                        step and kept through backward (shard-grad-op); between steps they rest
                                        sharded, which saves more than DeepSpeed's stage 2
3      ... and parameters               ``fully_shard(reshard_after_forward=True)``: gathered again for backward
=====  ==============================  ============================================================================

Each transformer block is its own FSDP unit (one all-gather per block), the rest of each stage one more unit::

    apply_fsdp(blocks, roots, dp_mesh, zero_stage=3, param_dtype=torch.bfloat16)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from trainjob.errors import ValidationError

__all__ = ["apply_activation_checkpointing", "apply_ddp", "apply_fsdp"]


def apply_fsdp(
    blocks: Sequence[nn.Module],
    roots: Sequence[nn.Module],
    dp_mesh: DeviceMesh,
    *,
    zero_stage: int = 3,
    param_dtype: torch.dtype | None = None,
    cpu_offload: bool = False,
) -> None:
    """``fully_shard`` every block, then every root (a pipeline stage or the whole model), in place.

    ``dp_mesh`` is 1-D (shard only) or 2-D ``(replicate, shard)`` for HSDP; parameters that are already tensor
    parallel DTensors get 2-D (data x tensor) sharding.
    """
    if zero_stage not in (1, 2, 3):
        raise ValidationError("zero_stage", f"FSDP implements ZeRO stages 1, 2 and 3, got {zero_stage}")
    options = {
        "mesh": dp_mesh,
        "reshard_after_forward": zero_stage == 3,
        # Compute in param_dtype, reduce gradients in float32.
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None
        ),
        "offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        if cpu_offload
        else OffloadPolicy(),
    }
    for block in blocks:
        fully_shard(block, **options)
    for root in roots:
        fully_shard(root, **options)


def apply_ddp(root: nn.Module, dp_mesh: DeviceMesh) -> nn.Module:
    """Wrap ``root`` in :class:`DistributedDataParallel` over the 1-D ``dp_mesh`` (ZeRO stage 0)."""
    device = next(root.parameters()).device
    return DistributedDataParallel(
        root,
        process_group=dp_mesh.get_group(),
        device_ids=[device.index] if device.type == "cuda" else None,
    )


def apply_activation_checkpointing(blocks: Sequence[nn.Module]) -> None:
    """Recompute each block's activations in backward instead of keeping them (non-reentrant checkpoint).

    The block's ``forward`` is wrapped on the instance, so parameter names do not change.
    """
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
