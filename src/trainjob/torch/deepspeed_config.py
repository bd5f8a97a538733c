"""Read a DeepSpeed ``ds_config.json`` and say what it means in trainjob's terms, without DeepSpeed installed.

``map_deepspeed_config`` checks the file once and returns :class:`DeepSpeedSettings`; ``prepare_model(model,
deepspeed_config="ds_config.json")`` and :func:`trainjob.torch.deepspeed_engine.deepspeed_initialize` build from it,
and ``trainjob plan --ds-config`` estimates its memory. Nothing here imports torch, so the planner stays quick.

==================================================  =================================================================
ds_config                                           trainjob
==================================================  =================================================================
``zero_optimization.stage`` 0                       ``prepare_model(model, "ddp")``: full replicas, all-reduced
                                                    gradients (one process: the model unwrapped)
``zero_optimization.stage`` 1                       FSDP2 as for stage 2. torch's FSDP2 always reduce-scatters
                                                    gradients, so they are sharded too, at the same traffic as
                                                    DeepSpeed's stage 1; trainjob has no DDP with a sharded
                                                    optimizer
``zero_optimization.stage`` 2                       FSDP2 with ``reshard_after_forward=False``: parameters gathered
                                                    once per step and kept through backward, gradients and optimizer
                                                    state sharded
``zero_optimization.stage`` 3                       FSDP2 full shard (``prepare_model(model, "fsdp")``)
``offload_optimizer`` / ``offload_param``           ``cpu_offload=True`` (stages 1-3): FSDP2's CPU offload keeps the
``{"device": "cpu"}``                               shard's parameters, gradients and optimizer state in host memory,
                                                    so either key offloads all three; ``"nvme"`` is refused
``fp16.enabled`` / ``bf16.enabled``                 ``mixed_precision="fp16"`` / ``"bf16"``
``fp16.loss_scale`` 0 (dynamic), ``initial_scale_   a GradScaler starting at ``2**initial_scale_power`` that doubles
power``, ``loss_scale_window``                      after ``loss_scale_window`` clean steps and halves on overflow;
                                                    a fixed ``loss_scale`` starts there and never grows
``gradient_accumulation_steps``                     ``GradientAccumulation(model, micro_steps=...)``
``gradient_clipping``                               ``clip_grad_norm_(model, value)`` (0: no clipping)
``train_batch_size``, ``train_micro_batch_size_     checked: ``train_batch_size = micro × accumulation × world size``;
per_gpu``                                           a missing or ``"auto"`` one is derived from the others
``optimizer`` / ``scheduler``                       built by ``deepspeed_optimizer`` / ``deepspeed_scheduler`` (Adam,
                                                    AdamW, SGD, Adagrad; WarmupLR, WarmupDecayLR, WarmupCosineLR)
==================================================  =================================================================

Tuning knobs with no counterpart here (bucket sizes, ``overlap_comm``, ``stage3_*`` thresholds, profilers, logging)
are accepted and listed in ``ignored``; keys DeepSpeed would not know either are named together in one warning.
``"auto"`` (as HuggingFace writes configs) means DeepSpeed's default, or the derived batch size::

    settings = map_deepspeed_config("ds_config.json", world_size=4)
    settings.strategy, settings.fsdp_zero_stage, settings.mixed_precision, settings.micro_batch_size
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainjob.errors import ValidationError

__all__ = ["DeepSpeedConfig", "DeepSpeedSettings", "LossScaling", "load_deepspeed_config", "map_deepspeed_config"]

DeepSpeedConfig = str | os.PathLike[str] | dict[str, Any]

# Keys read into DeepSpeedSettings, by section.
_MAPPED_TOP = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "optimizer", "scheduler", "fp16", "bf16", "zero_optimization", "amp",
}  # fmt: skip
# Keys DeepSpeed knows that change only speed, memory layout of buffers or logging: accepted, listed as ignored.
_IGNORED_TOP = {
    "steps_per_print", "wall_clock_breakdown", "prescale_gradients", "gradient_predivide_factor", "flops_profiler",
    "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "dump_state", "memory_breakdown",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "activation_checkpointing",
    "communication_data_type", "seq_parallel_communication_data_type", "data_types", "checkpoint", "aio",
    "sparse_gradients", "torch_autocast", "disable_allgather", "timers", "monitor_config", "autotuning",
}  # fmt: skip
_ZERO_MAPPED = {"stage", "offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_params"}
_ZERO_IGNORED = {
    "overlap_comm", "contiguous_gradients", "sub_group_size", "reduce_bucket_size", "allgather_bucket_size",
    "allgather_partitions", "reduce_scatter", "round_robin_gradients", "load_from_fp32_weights",
    "elastic_checkpoint", "ignore_unused_parameters", "legacy_stage1", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_model_persistence_threshold", "stage3_max_live_parameters",
    "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "stage3_module_granularity_threshold", "zero_hpz_partition_size",
    "zero_quantized_weights", "zero_quantized_gradients", "mics_shard_size", "mics_hierarchical_params_gather",
    "memory_efficient_linear", "use_multi_rank_bucket_allreduce", "log_trace_cache_warnings",
    "pipeline_loading_checkpoint", "override_module_apply", "use_all_reduce_for_fetch_params",
}  # fmt: skip
_OFFLOAD_KEYS = {"device", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu", "nvme_path", "fast_init",
                 "pipeline_read", "pipeline_write", "ratio"}  # fmt: skip
_FP16_KEYS = {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
              "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"}  # fmt: skip
_BF16_KEYS = {"enabled", "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
              "bf16_optimizer_states"}  # fmt: skip
_AMP_KEYS = {"enabled", "opt_level"}
# fp16 keys with no GradScaler equivalent: accepted, listed as ignored.
_FP16_APPROXIMATED = {"hysteresis", "consecutive_hysteresis", "min_loss_scale", "auto_cast",
                      "fp16_master_weights_and_grads"}  # fmt: skip


@dataclass(frozen=True)
class LossScaling:
    """fp16 loss scaling: a dynamic scale (``growth_interval`` clean steps to double) or a fixed one."""

    dynamic: bool
    init_scale: float
    growth_interval: int


@dataclass(frozen=True)
class DeepSpeedSettings:
    """What a ds_config asks for, as trainjob settings. ``used`` maps each key read (dotted) to its value."""

    source: str
    zero_stage: int
    strategy: Literal["ddp", "fsdp"]
    fsdp_zero_stage: int | None
    cpu_offload: bool
    mixed_precision: Literal["bf16", "fp16"] | None
    loss_scaling: LossScaling | None
    micro_batch_size: int
    gradient_accumulation_steps: int
    train_batch_size: int
    world_size: int
    gradient_clipping: float | None
    optimizer: dict[str, Any] | None
    scheduler: dict[str, Any] | None
    used: dict[str, Any] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    auto: list[str] = field(default_factory=list)


def load_deepspeed_config(config: DeepSpeedConfig) -> tuple[dict[str, Any], str]:
    """The config as a dict and a name for messages (the file's path, or ``"deepspeed_config"`` for a dict).

    A file that is not JSON is refused with its path, line and column::

        data, source = load_deepspeed_config("ds_config.json")
    """
    if isinstance(config, dict):
        return config, "deepspeed_config"
    if not isinstance(config, str | os.PathLike):
        raise ValidationError(
            "deepspeed_config", f"must be a path to a JSON file or a dict, got {type(config).__name__}"
        )
    path = Path(config)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError("deepspeed_config", f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError("deepspeed_config", f"cannot read {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            str(path), f"is not valid JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(data, dict):
        raise ValidationError(str(path), f"must hold a JSON object, got {type(data).__name__}")
    return data, str(path)


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.lower() == "auto"


def _default_world_size() -> int:
    import sys

    dist = sys.modules.get("torch.distributed")  # not imported: no process group can exist
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return int(os.environ.get("WORLD_SIZE", "1"))


class _Reader:
    """Collects used, ignored, unknown and "auto" keys, and the problems found, while the config is read."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.used: dict[str, Any] = {}
        self.ignored: list[str] = []
        self.unknown: list[str] = []
        self.auto: list[str] = []
        self.problems: list[ValidationError] = []

    def fail(self, key: str, message: str) -> None:
        self.problems.append(ValidationError(f"{self.source}: {key}", message))

    def section(
        self, data: Any, key: str, known: set[str], ignored: set[str] | frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        if data is None:
            return {}
        if not isinstance(data, dict):
            self.fail(key, f"must be an object, got {data!r}")
            return {}
        for name in data:
            dotted = f"{key}.{name}"
            if name in ignored:
                self.ignored.append(dotted)
            elif name not in known:
                self.unknown.append(dotted)
        return data

    def positive_int(self, data: dict[str, Any], key: str, dotted: str) -> int | None:
        """An integer >= 1, or None when missing or "auto"."""
        value = data.get(key)
        if value is None:
            return None
        if _is_auto(value):
            self.auto.append(dotted)
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.fail(dotted, f'must be an integer >= 1 or "auto", got {value!r}')
            return None
        self.used[dotted] = value
        return value

    def enabled(self, data: dict[str, Any], dotted: str) -> bool:
        value = data.get("enabled", False)
        if _is_auto(value):
            self.auto.append(f"{dotted}.enabled")
            return False
        if not isinstance(value, bool):
            self.fail(f"{dotted}.enabled", f'must be true, false or "auto", got {value!r}')
            return False
        self.used[f"{dotted}.enabled"] = value
        return value


def map_deepspeed_config(config: DeepSpeedConfig, world_size: int | None = None) -> DeepSpeedSettings:
    """Check a ds_config (a JSON file's path or a dict) and translate it; see the module's table.

    ``world_size`` (data-parallel ranks) defaults to the process group's, else ``WORLD_SIZE``, else 1. Every problem
    is reported at once, each naming the file and key. Keys no DeepSpeed release knows are named in one
    ``UserWarning``::

        settings = map_deepspeed_config({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}})
    """
    data, source = load_deepspeed_config(config)
    world = _default_world_size() if world_size is None else world_size
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValidationError("world_size", f"must be an integer >= 1, got {world!r}")
    read = _Reader(source)
    for key in data:
        if key in _IGNORED_TOP:
            read.ignored.append(key)
        elif key not in _MAPPED_TOP:
            read.unknown.append(key)

    zero = read.section(data.get("zero_optimization"), "zero_optimization", _ZERO_MAPPED, _ZERO_IGNORED)
    stage = _zero_stage(read, zero)
    cpu_offload = _offload(read, zero, stage)
    mixed_precision, loss_scaling = _precision(read, data)
    micro, accumulation, total = _batch_sizes(read, data, world)
    clipping = _clipping(read, data)
    optimizer = _named_block(read, data, "optimizer")
    scheduler = _named_block(read, data, "scheduler")
    if read.problems:
        raise ValidationError.combine(read.problems)
    if read.unknown:
        warnings.warn(
            f"{source}: ignoring keys trainjob does not know: {', '.join(read.unknown)}", UserWarning, stacklevel=2
        )
    return DeepSpeedSettings(
        source=source,
        zero_stage=stage,
        strategy="ddp" if stage == 0 else "fsdp",
        fsdp_zero_stage=None if stage == 0 else max(stage, 2),
        cpu_offload=cpu_offload,
        mixed_precision=mixed_precision,
        loss_scaling=loss_scaling,
        micro_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        train_batch_size=total,
        world_size=world,
        gradient_clipping=clipping,
        optimizer=optimizer,
        scheduler=scheduler,
        used=read.used,
        ignored=read.ignored,
        unknown=read.unknown,
        auto=read.auto,
    )


def _zero_stage(read: _Reader, zero: dict[str, Any]) -> int:
    stage = zero.get("stage", 0)
    if _is_auto(stage):
        read.auto.append("zero_optimization.stage")
        return 0
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        read.fail("zero_optimization.stage", f"must be 0, 1, 2 or 3, got {stage!r}")
        return 0
    read.used["zero_optimization.stage"] = stage
    return int(stage)


def _offload(read: _Reader, zero: dict[str, Any], stage: int) -> bool:
    offloaded = []
    for key in ("offload_optimizer", "offload_param"):
        block = read.section(zero.get(key), f"zero_optimization.{key}", {"device"}, _OFFLOAD_KEYS - {"device"})
        device = block.get("device", "none") if block else "none"
        if device not in ("cpu", "none", None):
            read.fail(f"zero_optimization.{key}.device", f'must be "cpu" or "none" (no NVMe offload here), got {device!r}')
            continue
        if block:
            read.used[f"zero_optimization.{key}.device"] = device
        if device == "cpu":
            offloaded.append(key)
    for key in ("cpu_offload", "cpu_offload_params"):  # older spellings of the two blocks
        if zero.get(key) is True:
            read.used[f"zero_optimization.{key}"] = True
            offloaded.append(key)
    if offloaded and stage == 0:
        read.fail(f"zero_optimization.{offloaded[0]}", "needs zero_optimization.stage 1, 2 or 3 (offload is per shard)")
    if "offload_param" in offloaded and stage != 3:
        read.fail("zero_optimization.offload_param", f"needs zero_optimization.stage 3, got stage {stage}")
    return bool(offloaded)


def _precision(read: _Reader, data: dict[str, Any]) -> tuple[Literal["bf16", "fp16"] | None, LossScaling | None]:
    fp16 = read.section(data.get("fp16"), "fp16", _FP16_KEYS - _FP16_APPROXIMATED, _FP16_APPROXIMATED)
    bf16 = read.section(data.get("bf16"), "bf16", {"enabled"}, _BF16_KEYS - {"enabled"})
    amp = read.section(data.get("amp"), "amp", _AMP_KEYS)
    use_fp16 = read.enabled(fp16, "fp16") if fp16 else False
    use_bf16 = read.enabled(bf16, "bf16") if bf16 else False
    if amp and read.enabled(amp, "amp"):
        read.fail("amp.enabled", 'NVIDIA Apex AMP is not available here: use "fp16" or "bf16" instead')
    if use_fp16 and use_bf16:
        read.fail("fp16.enabled", "and bf16.enabled are both true: enable one of them")
        return None, None
    if use_bf16:
        return "bf16", None
    if not use_fp16:
        return None, None
    scale = fp16.get("loss_scale", 0)
    power = fp16.get("initial_scale_power", 16)
    window = fp16.get("loss_scale_window", 1000)
    checks = (("loss_scale", scale, 0), ("initial_scale_power", power, 0), ("loss_scale_window", window, 1))
    for key, value, least in checks:
        if _is_auto(value):
            read.auto.append(f"fp16.{key}")
        elif isinstance(value, bool) or not isinstance(value, int | float) or value < least:
            read.fail(f"fp16.{key}", f"must be a number >= {least}, got {value!r}")
            return "fp16", None
        else:
            read.used[f"fp16.{key}"] = value
    scale = 0 if _is_auto(scale) else scale
    power = 16 if _is_auto(power) else power
    window = 1000 if _is_auto(window) else int(window)
    if scale == 0:
        return "fp16", LossScaling(dynamic=True, init_scale=2.0 ** power, growth_interval=window)
    return "fp16", LossScaling(dynamic=False, init_scale=float(scale), growth_interval=window)


def _batch_sizes(read: _Reader, data: dict[str, Any], world: int) -> tuple[int, int, int]:
    """DeepSpeed's rule ``train_batch_size = micro × accumulation × world``: check it, or derive the missing one."""
    total = read.positive_int(data, "train_batch_size", "train_batch_size")
    micro = read.positive_int(data, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu")
    accumulation = read.positive_int(data, "gradient_accumulation_steps", "gradient_accumulation_steps")
    if read.problems:
        return 1, 1, world
    if total is not None and micro is not None and accumulation is not None:
        if total != micro * accumulation * world:
            read.fail(
                "train_batch_size",
                f"must equal train_micro_batch_size_per_gpu × gradient_accumulation_steps × world size "
                f"({micro} × {accumulation} × {world} = {micro * accumulation * world}), got {total}; "
                'set one of them to "auto" to derive it',
            )
        return micro, accumulation, total
    if total is not None and micro is not None:
        if total % (micro * world):
            read.fail(
                "train_batch_size",
                f"must be a multiple of train_micro_batch_size_per_gpu × world size ({micro} × {world} = "
                f"{micro * world}) to derive gradient_accumulation_steps, got {total}",
            )
            return micro, 1, total
        return micro, total // (micro * world), total
    if total is not None:
        accumulation = accumulation or 1
        if total % (accumulation * world):
            read.fail(
                "train_batch_size",
                f"must be a multiple of gradient_accumulation_steps × world size ({accumulation} × {world} = "
                f"{accumulation * world}) to derive train_micro_batch_size_per_gpu, got {total}",
            )
            return 1, accumulation, total
        return total // (accumulation * world), accumulation, total
    if micro is not None:
        accumulation = accumulation or 1
        return micro, accumulation, micro * accumulation * world
    read.fail(
        "train_batch_size",
        "give train_batch_size or train_micro_batch_size_per_gpu (a number; the other may be \"auto\")",
    )
    return 1, 1, world


def _clipping(read: _Reader, data: dict[str, Any]) -> float | None:
    value = data.get("gradient_clipping")
    if value is None:
        return None
    if _is_auto(value):
        read.auto.append("gradient_clipping")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        read.fail("gradient_clipping", f'must be a number >= 0 (0: no clipping) or "auto", got {value!r}')
        return None
    read.used["gradient_clipping"] = value
    return float(value) if value > 0 else None


def _named_block(read: _Reader, data: dict[str, Any], key: str) -> dict[str, Any] | None:
    """``{"type": ..., "params": {...}}`` as given; which types exist is checked when the object is built."""
    block = read.section(data.get(key), key, {"type", "params"})
    if not block:
        return None
    kind, params = block.get("type"), block.get("params", {})
    if not isinstance(kind, str) or not kind:
        read.fail(f"{key}.type", f"must name the {key}, got {kind!r}")
        return None
    if not isinstance(params, dict):
        read.fail(f"{key}.params", f"must be an object, got {params!r}")
        return None
    read.used[f"{key}.type"] = kind
    for name, value in params.items():
        if _is_auto(value):
            read.auto.append(f"{key}.params.{name}")
        else:
            read.used[f"{key}.params.{name}"] = value
    return {"type": kind, "params": dict(params)}
