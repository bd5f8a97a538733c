"""The module wrappers behind ``prepare_model`` (1-D) and ``parallelize`` (N-D): FSDP2, DDP, activation checkpointing.

Blocks (the FSDP units and the activation-checkpointing units) are picked by :func:`select_blocks` from ``wrap``:

* ``None`` (default): every element of an ``nn.ModuleList`` (how transformer layers are usually held);
* a module class or tuple of classes: every submodule of that class;
* an ``int``: the smallest subtrees holding at least that many parameters not already in a block;
* a callable ``(module) -> bool``.

FSDP implements ZeRO stages 1 to 3; stage 0 is :func:`apply_ddp`. Ranks of a 1-D mesh shard; a 2-D
``(replicate, shard)`` mesh gives HSDP, and parameters that are already tensor-parallel DTensors get 2-D sharding.

=====  ==============================  ============================================================================
stage  DeepSpeed shards                 here
=====  ==============================  ============================================================================
0      nothing                          :func:`apply_ddp`: full replica per rank, gradients all-reduced in buckets
1      optimizer state                  as stage 2: FSDP2 always reduce-scatters gradients, so gradients are sharded
                                        too at no extra traffic
2      optimizer state, gradients       ``reshard_after_forward=False``: parameters gathered once per step and kept
                                        through backward; between steps they rest sharded, which saves more than
                                        DeepSpeed's stage 2
3      ... and parameters               blocks gathered again for backward (the root keeps its parameters: backward
                                        needs them first)
=====  ==============================  ============================================================================

::

    blocks = apply_activation_checkpointing(model, select_blocks(model, Block))
    apply_fsdp(blocks, [model], zero_stage=3, param_dtype=torch.bfloat16, output_dtype=torch.float32)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainjob.errors import ValidationError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "DDP_BUCKET_CAP_MB",
    "Wrap",
    "apply_activation_checkpointing",
    "apply_ddp",
    "apply_fsdp",
    "select_blocks",
]

Wrap = type[nn.Module] | tuple[type[nn.Module], ...] | int | Callable[[nn.Module], bool] | None

DDP_BUCKET_CAP_MB = 25
_WRAP_ACCEPTED = "must be a module class, a parameter count, a predicate or None"


def _by_parameter_count(model: nn.Module, min_params: int) -> list[nn.Module]:
    blocks: list[nn.Module] = []

    def unwrapped_params(module: nn.Module) -> int:
        count = sum(p.numel() for p in module.parameters(recurse=False))
        for child in module.children():
            count += unwrapped_params(child)
        if module is not model and count >= min_params:
            blocks.append(module)
            return 0
        return count

    unwrapped_params(model)
    return blocks


def select_blocks(model: nn.Module, wrap: Wrap = None) -> list[nn.Module]:
    """The submodules ``wrap`` picks, innermost first (the order ``fully_shard`` must be applied in)::

    select_blocks(transformer)            # the layers held in nn.ModuleLists
    select_blocks(mlp, wrap=1_000_000)    # subtrees of at least a million parameters
    """
    if isinstance(wrap, bool):
        raise ValidationError("wrap", f"{_WRAP_ACCEPTED}, got {wrap!r}")
    if isinstance(wrap, int):
        if wrap < 1:
            raise ValidationError("wrap", f"a parameter count must be >= 1, got {wrap}")
        return _by_parameter_count(model, wrap)
    if wrap is None:
        in_lists = {id(m) for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst}
        picked: Callable[[nn.Module], bool] = lambda m: id(m) in in_lists  # noqa: E731
    elif isinstance(wrap, type) or (isinstance(wrap, tuple) and all(isinstance(c, type) for c in wrap)):
        classes = wrap
        picked = lambda m: isinstance(m, classes)  # noqa: E731
    elif callable(wrap):
        picked = wrap
    else:
        raise ValidationError("wrap", f"{_WRAP_ACCEPTED}, got {wrap!r}")
    return [m for m in reversed(list(model.modules())) if m is not model and picked(m)]


def apply_activation_checkpointing(model: nn.Module, blocks: Sequence[nn.Module]) -> list[nn.Module]:
    """Recompute each block's activations in backward instead of keeping them (non-reentrant checkpoint).

    Every outermost block under ``model`` is replaced in its parent by a ``CheckpointWrapper``; state-dict keys
    and ``torch.distributed.checkpoint`` names stay those of the plain model. Returns ``blocks`` with the
    replaced ones swapped for their wrappers (the units to hand to :func:`apply_fsdp`)::

        blocks = apply_activation_checkpointing(model, select_blocks(model))
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    inner = {id(sub) for block in blocks for sub in block.modules() if sub is not block}
    targets = {id(block) for block in blocks if id(block) not in inner}
    replaced: dict[int, nn.Module] = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in targets:
                wrapper = checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
                setattr(parent, name, wrapper)
                replaced[id(child)] = wrapper
    return [replaced.get(id(block), block) for block in blocks]


def apply_fsdp(
    blocks: Sequence[nn.Module],
    roots: Sequence[nn.Module],
    mesh: DeviceMesh | None = None,
    *,
    zero_stage: int = 3,
    param_dtype: torch.dtype | None = None,
    output_dtype: torch.dtype | None = None,
    cpu_offload: bool = False,
) -> None:
    """``fully_shard`` every block, innermost first, then every root (a whole model or a pipeline stage), in place.

    ``mesh`` defaults to all ranks. With ``param_dtype`` parameters are gathered and used in that dtype while
    gradients are reduced in float32; ``output_dtype`` casts the roots' floating outputs (float32 for the loss)
    while blocks hand activations on in ``param_dtype``. ``cpu_offload`` keeps sharded parameters, gradients and
    optimizer state in host memory::

        apply_fsdp(blocks, [model], dp_mesh, zero_stage=2, param_dtype=torch.bfloat16)
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if zero_stage not in (1, 2, 3):
        raise ValidationError("zero_stage", f"FSDP implements ZeRO stages 1, 2 and 3, got {zero_stage!r}")
    reduce_dtype = torch.float32 if param_dtype is not None else None
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()
    # None lets FSDP keep the roots' parameters gathered after forward; blocks then reshard (ZeRO-3).
    reshard = None if zero_stage == 3 else False
    block_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    root_policy = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=reduce_dtype, output_dtype=output_dtype
    )
    for module, policy in [*((b, block_policy) for b in blocks), *((r, root_policy) for r in roots)]:
        fully_shard(
            module, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy, offload_policy=offload
        )


def apply_ddp(module: nn.Module, mesh: DeviceMesh | None = None) -> nn.Module:
    """Wrap ``module`` in :class:`~torch.nn.parallel.DistributedDataParallel` over the 1-D ``mesh`` (default: all
    ranks), on the device its parameters are on; gradients are all-reduced in buckets they live in::

        model = apply_ddp(model.to(device))
    """
    device = next(module.parameters()).device
    return nn.parallel.DistributedDataParallel(
        module,
        process_group=mesh.get_group() if mesh is not None else None,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=DDP_BUCKET_CAP_MB,
        gradient_as_bucket_view=True,  # gradients live in the buckets: no second copy
    )
