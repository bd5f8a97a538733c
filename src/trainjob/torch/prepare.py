"""Wrap a plain model for data-parallel training with PyTorch's own DDP or FSDP2 (``fully_shard``).

=========  ============================================================================================
strategy   what happens
=========  ============================================================================================
``none``   moved to the device; nothing is synchronised (evaluation, or a job of one process)
``ddp``    ``DistributedDataParallel``: full replica per rank, gradients all-reduced in 25 MB buckets
``fsdp``   ``fully_shard`` on every block, then on the root: parameters, gradients and optimizer state
           sharded across ranks, gathered block by block for compute
=========  ============================================================================================

Blocks (the FSDP units and the activation-checkpointing units) are chosen by ``wrap``:

* ``None`` (default): every element of an ``nn.ModuleList`` (how transformer layers are usually held);
* a module class or tuple of classes: every submodule of that class;
* an ``int``: the smallest subtrees holding at least that many parameters not already in a block;
* a callable ``(module) -> bool``.

::

    model = prepare_model(Net(), "fsdp", mixed_precision="bf16", activation_checkpointing=True, wrap=Block)
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from trainjob.errors import ValidationError
from trainjob.torch.env import init
from trainjob.torch.precision import Precision, autocast_forward, precision_dtype

if TYPE_CHECKING:
    from trainjob.torch.parallel import ParallelDims

__all__ = ["Strategy", "Wrap", "prepare_model", "select_blocks"]

Strategy = Literal["ddp", "fsdp", "none"]
Wrap = type[nn.Module] | tuple[type[nn.Module], ...] | int | Callable[[nn.Module], bool] | None

_STRATEGIES = ("ddp", "fsdp", "none")
DDP_BUCKET_CAP_MB = 25


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
        raise ValidationError("wrap", f"must be a module class, a parameter count, a predicate or None, got {wrap!r}")
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
        raise ValidationError("wrap", f"must be a module class, a parameter count, a predicate or None, got {wrap!r}")
    return [m for m in reversed(list(model.modules())) if m is not model and picked(m)]


def _outermost(blocks: list[nn.Module]) -> list[nn.Module]:
    inner = {id(sub) for b in blocks for sub in b.modules() if sub is not b}
    return [b for b in blocks if id(b) not in inner]


def _apply_activation_checkpointing(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """Replace each outermost block by a checkpoint wrapper (state-dict keys stay the same); return the units."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    wrap_one = partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    targets = {id(b) for b in _outermost(blocks)}
    if not targets:
        raise ValidationError(
            "activation_checkpointing", "no block to checkpoint: pass wrap= a block class, a parameter count or a predicate"
        )
    replaced: dict[int, nn.Module] = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in targets:
                wrapper = wrap_one(child)
                setattr(parent, name, wrapper)
                replaced[id(child)] = wrapper
    return [replaced.get(id(b), b) for b in blocks]


def _fully_shard(
    model: nn.Module, blocks: list[nn.Module], precision: Precision | None, cpu_offload: bool
) -> nn.Module:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    dtype = precision_dtype(precision)
    # Blocks pass activations on in the compute dtype; only the root hands float32 to the loss.
    block_policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    root_policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32, output_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()
    for block in blocks:
        fully_shard(block, mp_policy=block_policy, offload_policy=offload)
    # The root keeps its parameters gathered after forward: backward needs them first.
    fully_shard(model, mp_policy=root_policy, offload_policy=offload, reshard_after_forward=False)
    return model


def prepare_model(
    model: nn.Module,
    strategy: Strategy | None = None,
    *,
    mixed_precision: Precision | None = None,
    activation_checkpointing: bool = False,
    cpu_offload: bool = False,
    wrap: Wrap = None,
    parallel: ParallelDims | None = None,
) -> nn.Module:
    """Return ``model`` ready for training under ``strategy`` (``"ddp"`` unless ``parallel`` is given).

    ``mixed_precision`` (``"bf16"`` or ``"fp16"``) runs compute in that dtype and returns float32 outputs:
    FSDP through ``MixedPrecisionPolicy`` (gradients reduced in float32), DDP and ``none`` through autocast;
    ``"fp16"`` also needs loss scaling (:func:`trainjob.torch.grad_scaler`). In a job of one process ``"ddp"``
    leaves the model unwrapped: there is nothing to synchronise.
    ``cpu_offload`` (FSDP only) keeps sharded parameters, gradients and optimizer state in host memory.
    ``parallel`` (a :class:`trainjob.torch.parallel.ParallelDims`) hands the model to
    :func:`trainjob.torch.parallel.parallelize` for tensor, pipeline and 3-D parallelism.

    Create the optimizer from the returned model's parameters::

        model = prepare_model(Net(), "ddp")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    """
    precision_dtype(mixed_precision)  # validate early
    if parallel is not None:
        if strategy is not None:
            raise ValidationError("strategy", f"leave it out when parallel= is given, got {strategy!r}")
        from trainjob.torch.parallel import parallelize

        return parallelize(
            model,
            parallel,
            mixed_precision=mixed_precision,
            activation_checkpointing=activation_checkpointing,
            cpu_offload=cpu_offload,
        )
    strategy = strategy or "ddp"
    if strategy not in _STRATEGIES:
        raise ValidationError("strategy", f"must be one of {', '.join(map(repr, _STRATEGIES))}, got {strategy!r}")
    if cpu_offload and strategy != "fsdp":
        raise ValidationError("cpu_offload", f"needs strategy='fsdp', got strategy={strategy!r}")

    ctx = init()
    blocks = select_blocks(model, wrap)
    if activation_checkpointing:
        blocks = _apply_activation_checkpointing(model, blocks)
    if strategy == "fsdp":
        if not cpu_offload:
            model.to(ctx.device)
        return _fully_shard(model, blocks, mixed_precision, cpu_offload)

    model.to(ctx.device)
    if mixed_precision is not None:
        autocast_forward(model, mixed_precision, ctx.device)
    if strategy == "none" or ctx.world_size == 1:
        return model
    return nn.parallel.DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=DDP_BUCKET_CAP_MB,
        gradient_as_bucket_view=True,  # gradients live in the buckets: no second copy
    )
