"""Wrap a plain model for data-parallel training with PyTorch's own DDP or FSDP2 (``fully_shard``).

=========  ============================================================================================
strategy   what happens
=========  ============================================================================================
``none``   moved to the device; nothing is synchronised (evaluation, or a job of one process)
``ddp``    ``DistributedDataParallel``: full replica per rank, gradients all-reduced in 25 MB buckets
``fsdp``   ``fully_shard`` on every block, then on the root: parameters, gradients and optimizer state
           sharded across ranks, gathered block by block for compute (ZeRO-3)
=========  ============================================================================================

``comm_hook`` (DDP only) compresses the gradient all-reduce: ``"fp16"``, ``"bf16"``, ``"powersgd"`` or ``"topk"``
with ``comm_hook_options`` (see :mod:`trainjob.torch.comm_hooks`).

Blocks (the FSDP units and the activation-checkpointing units) are chosen by ``wrap`` (see
:func:`trainjob.torch.wrap.select_blocks`). With ``parallel=ParallelDims(...)`` the model goes to
:func:`trainjob.torch.parallel.parallelize` instead, which uses the same FSDP, DDP and checkpointing wrappers::

    model = prepare_model(Net(), "fsdp", mixed_precision="bf16", activation_checkpointing=True, wrap=Block)
    model = prepare_model(GPT(cfg), parallel=ParallelDims(tp=2, pp=2), pipeline=PipelineConfig("GPipe"))
    model = prepare_model(Net(), "ddp", comm_hook="topk", comm_hook_options={"ratio": 0.01})

``deepspeed_config`` (a ds_config.json path, a dict, or settings from
:func:`trainjob.torch.deepspeed_config.map_deepspeed_config`) chooses the strategy, precision and offload from
DeepSpeed's keys instead; the table is in :mod:`trainjob.torch.deepspeed_config`. ZeRO stages 1 and 2 become
FSDP with ``reshard_after_forward=False``, stage 3 full sharding, stage 0 DDP::

    model = prepare_model(Net(), deepspeed_config="ds_config.json")

``prepare_model`` is a short list of steps, each a function here: :func:`_read_deepspeed_config`,
:func:`_check_prepare_options`, then :func:`_apply_parallel` (with ``parallel=``) or :func:`_check_strategy`,
:func:`_apply_ac`, and :func:`_apply_fsdp_strategy` or :func:`_apply_autocast` + :func:`_apply_ddp_strategy`.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from trainjob.errors import ValidationError
from trainjob.torch.comm_hooks import CommHook, check_comm_hook, register_comm_hook
from trainjob.torch.data_layout import set_current_layout
from trainjob.torch.deepspeed_config import DeepSpeedConfig, DeepSpeedSettings, map_deepspeed_config
from trainjob.torch.env import init
from trainjob.torch.precision import Precision, autocast_forward, precision_dtype
from trainjob.torch.wrap import Wrap, apply_activation_checkpointing, apply_ddp, apply_fsdp, select_blocks

if TYPE_CHECKING:
    from trainjob.torch.parallel import ParallelDims

__all__ = ["Strategy", "prepare_model"]

Strategy = Literal["ddp", "fsdp", "none"]

_STRATEGIES = ("ddp", "fsdp", "none")


def prepare_model(
    model: nn.Module,
    strategy: Strategy | None = None,
    *,
    mixed_precision: Precision | None = None,
    activation_checkpointing: bool = False,
    cpu_offload: bool = False,
    wrap: Wrap = None,
    parallel: ParallelDims | None = None,
    comm_hook: CommHook | None = None,
    comm_hook_options: dict[str, Any] | None = None,
    deepspeed_config: DeepSpeedConfig | DeepSpeedSettings | None = None,
    **parallel_options: Any,
) -> nn.Module:
    """Return ``model`` ready for training under ``strategy`` (``"ddp"`` unless ``parallel`` is given).

    ``mixed_precision`` (``"bf16"`` or ``"fp16"``) runs compute in that dtype and returns float32 outputs:
    FSDP through ``MixedPrecisionPolicy`` (gradients reduced in float32), DDP and ``none`` through autocast;
    ``"fp16"`` also needs loss scaling (:func:`trainjob.torch.grad_scaler`). In a job of one process ``"ddp"``
    leaves the model unwrapped: there is nothing to synchronise.
    ``cpu_offload`` (FSDP only) keeps sharded parameters, gradients and optimizer state in host memory.
    ``parallel`` (a :class:`trainjob.torch.parallel.ParallelDims`) hands the model to
    :func:`trainjob.torch.parallel.parallelize` for tensor, pipeline and 3-D parallelism, together with
    ``parallel_options``: any of parallelize's own keywords (``pipeline``, ``zero_stage``, ``sequence_parallel``,
    ``tp_plan``, ``loss_fn``, ``mesh``).
    ``comm_hook`` compresses DDP's gradient all-reduce (``"fp16"``, ``"bf16"``, ``"powersgd"``, ``"topk"``), tuned
    by ``comm_hook_options`` (``{"ratio": 0.01}`` for top-k, ``{"rank": 2}`` for PowerSGD; see
    :mod:`trainjob.torch.comm_hooks`). It needs DDP: ``strategy="ddp"``, or ``parallel=`` with ``zero_stage=0``.
    ``deepspeed_config`` sets ``strategy``, ``mixed_precision`` and ``cpu_offload`` from a ds_config (leave those
    out); build the optimizer with :func:`trainjob.torch.deepspeed_engine.deepspeed_optimizer`.

    Create the optimizer from the returned model's parameters::

        model = prepare_model(Net(), "ddp")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model = prepare_model(GPT(cfg), parallel=ParallelDims(dp_shard=-1, tp=2), zero_stage=2)
    """
    fsdp_zero_stage = 3
    if deepspeed_config is not None:
        settings = _read_deepspeed_config(
            deepspeed_config, strategy=strategy, mixed_precision=mixed_precision, cpu_offload=cpu_offload,
            parallel=parallel,
        )  # fmt: skip
        strategy, mixed_precision, cpu_offload = settings.strategy, settings.mixed_precision, settings.cpu_offload
        fsdp_zero_stage = settings.fsdp_zero_stage or 3
    hook_options = _check_prepare_options(
        mixed_precision, comm_hook, comm_hook_options, strategy, parallel, parallel_options
    )
    if parallel is not None:
        return _apply_parallel(
            model, parallel, strategy=strategy, wrap=wrap, mixed_precision=mixed_precision,
            activation_checkpointing=activation_checkpointing, cpu_offload=cpu_offload, comm_hook=comm_hook,
            hook_options=hook_options, parallel_options=parallel_options,
        )  # fmt: skip
    set_current_layout(None)  # data parallel over every rank: loaders shard by global rank again
    strategy = _check_strategy(strategy or "ddp", cpu_offload)
    ctx = init()
    blocks = select_blocks(model, wrap)
    if activation_checkpointing:
        blocks = _apply_ac(model, blocks)
    if strategy == "fsdp":
        return _apply_fsdp_strategy(model, blocks, ctx.device, fsdp_zero_stage, mixed_precision, cpu_offload)
    model.to(ctx.device)
    _apply_autocast(model, mixed_precision, ctx.device)
    if strategy == "none" or ctx.world_size == 1:
        return model  # nothing is all-reduced: a comm hook would have nothing to compress
    return _apply_ddp_strategy(model, comm_hook, hook_options)


def _read_deepspeed_config(
    config: DeepSpeedConfig | DeepSpeedSettings,
    *,
    strategy: Strategy | None,
    mixed_precision: Precision | None,
    cpu_offload: bool,
    parallel: ParallelDims | None,
) -> DeepSpeedSettings:
    """The strategy, precision and offload a ds_config chooses; prepare_model's own ``strategy``,
    ``mixed_precision``, ``cpu_offload`` and ``parallel`` must be left out (``None``/``False``) for it."""
    given = {"strategy": strategy, "mixed_precision": mixed_precision, "cpu_offload": cpu_offload or None,
             "parallel": parallel}  # fmt: skip
    clash = next((name for name, value in given.items() if value is not None), None)
    if clash is not None:
        raise ValidationError(clash, "comes from deepspeed_config: leave it out, or leave deepspeed_config out")
    if isinstance(config, DeepSpeedSettings):
        return config
    return map_deepspeed_config(config, world_size=init().world_size)


def _check_prepare_options(
    mixed_precision: Precision | None,
    comm_hook: CommHook | None,
    comm_hook_options: dict[str, Any] | None,
    strategy: str | None,
    parallel: ParallelDims | None,
    parallel_options: dict[str, Any],
) -> dict[str, Any]:
    """Refuse a precision, a parallelize option or a comm hook that cannot apply, before anything changes; returns
    the comm hook's checked options (``{}`` without one)."""
    precision_dtype(mixed_precision)
    if parallel_options:
        _check_parallel_options(parallel_options, parallel)
    return _check_hook(comm_hook, comm_hook_options, strategy, parallel, parallel_options)


def _apply_parallel(
    model: nn.Module,
    parallel: ParallelDims,
    *,
    strategy: Strategy | None,
    wrap: Wrap,
    mixed_precision: Precision | None,
    activation_checkpointing: bool,
    cpu_offload: bool,
    comm_hook: CommHook | None,
    hook_options: dict[str, Any],
    parallel_options: dict[str, Any],
) -> nn.Module:
    """Hand the model to :func:`trainjob.torch.parallel.parallelize`, then register ``comm_hook`` on the stages it
    wrapped in DDP."""
    if strategy is not None:
        raise ValidationError("strategy", f"leave it out when parallel= is given, got {strategy!r}")
    if wrap is not None:
        raise ValidationError("wrap", "parallelize shards the blocks in model.layers: leave wrap out with parallel=")
    # Loaded on use: plain DDP/FSDP never loads the parallel package.
    from trainjob.torch.parallel import parallelize

    parallel_model = parallelize(
        model,
        parallel,
        mixed_precision=mixed_precision,
        activation_checkpointing=activation_checkpointing,
        cpu_offload=cpu_offload,
        **parallel_options,
    )
    if comm_hook is not None:
        for part in parallel_model.parts:
            if isinstance(part, nn.parallel.DistributedDataParallel):
                register_comm_hook(part, comm_hook, hook_options)
    return parallel_model


def _check_strategy(strategy: str, cpu_offload: bool) -> Strategy:
    """``strategy`` if it is one of ``ddp``, ``fsdp``, ``none`` and can take ``cpu_offload``."""
    if strategy not in _STRATEGIES:
        raise ValidationError(
            "strategy", f"must be one of {', '.join(map(repr, _STRATEGIES))}, got {strategy!r}"
        )
    if cpu_offload and strategy != "fsdp":
        raise ValidationError("cpu_offload", f"needs strategy='fsdp', got strategy={strategy!r}")
    return strategy  # type: ignore[return-value]


def _apply_ac(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """Wrap ``blocks`` in activation checkpointing; returns the wrapped blocks (FSDP's units then)."""
    if not blocks:
        raise ValidationError(
            "activation_checkpointing",
            "no block to checkpoint: pass wrap= a block class, a parameter count or a predicate",
        )
    return apply_activation_checkpointing(model, blocks)


def _apply_fsdp_strategy(
    model: nn.Module,
    blocks: list[nn.Module],
    device: torch.device,
    zero_stage: int,
    mixed_precision: Precision | None,
    cpu_offload: bool,
) -> nn.Module:
    """FSDP2 on every block, then on the root, over all ranks; the model goes to ``device`` unless offloaded."""
    if not cpu_offload:
        model.to(device)
    dtype = precision_dtype(mixed_precision)
    # Blocks pass activations on in the compute dtype; only the root hands float32 to the loss.
    apply_fsdp(
        blocks,
        [model],
        zero_stage=zero_stage,
        param_dtype=dtype,
        output_dtype=torch.float32 if dtype is not None else None,
        cpu_offload=cpu_offload,
    )
    return model


def _apply_autocast(model: nn.Module, mixed_precision: Precision | None, device: torch.device) -> None:
    """Run ``model``'s forward under autocast in ``mixed_precision`` (nothing for ``None``), float32 outputs."""
    if mixed_precision is not None:
        autocast_forward(model, mixed_precision, device)


def _apply_ddp_strategy(model: nn.Module, comm_hook: CommHook | None, hook_options: dict[str, Any]) -> nn.Module:
    """DDP over all ranks, its gradient all-reduce compressed by ``comm_hook`` when one is given."""
    ddp = apply_ddp(model)
    if comm_hook is not None:
        register_comm_hook(ddp, comm_hook, hook_options)
    return ddp


def _check_hook(
    name: CommHook | None,
    options: dict[str, Any] | None,
    strategy: str | None,
    parallel: ParallelDims | None,
    parallel_options: dict[str, Any],
) -> dict[str, Any]:
    """A comm hook needs DDP: refuse FSDP, tensor parallelism and ``"none"`` with the reason, before any work."""
    if name is None:
        if options is not None:
            raise ValidationError("comm_hook_options", "needs comm_hook= (fp16, bf16, powersgd or topk)")
        return {}
    settings = check_comm_hook(name, options)
    if parallel is None:
        if strategy == "fsdp":
            raise ValidationError(
                "comm_hook",
                "needs strategy='ddp': FSDP reduce-scatters sharded gradients itself and has no DDP comm hooks",
            )
        if strategy == "none":
            raise ValidationError("comm_hook", "needs strategy='ddp': with 'none' nothing is all-reduced")
        return settings
    zero_stage = parallel_options.get("zero_stage", 3)
    if zero_stage != 0:
        raise ValidationError(
            "comm_hook",
            f"needs DDP, which parallelize uses for zero_stage=0; got zero_stage={zero_stage} (FSDP reduce-scatters "
            "sharded gradients itself and has no DDP comm hooks)",
        )
    if parallel.tp > 1:
        raise ValidationError(
            "comm_hook", f"needs DDP, which cannot wrap tensor-parallel layers (tp={parallel.tp})"
        )
    return settings


def _check_parallel_options(options: dict[str, Any], parallel: ParallelDims | None) -> None:
    """Every extra keyword must be one of parallelize's, and needs ``parallel=``."""
    from trainjob.torch.parallel import parallelize

    own = set(inspect.signature(prepare_model).parameters)
    accepted = [
        name
        for name, param in inspect.signature(parallelize).parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY and name not in own
    ]
    for name in options:
        if name not in accepted:
            raise ValidationError(
                name,
                f"is not an option of prepare_model; with parallel= it also accepts {', '.join(accepted)}",
            )
    if parallel is None:
        name = next(iter(options))
        raise ValidationError(name, "is an option of parallelize: it needs parallel=ParallelDims(...)")
