"""The layout a DeepSpeed config describes, for ``trainjob plan --ds-config``.

The config gives the ZeRO stage, precision, optimizer, micro-batch and accumulation; the model and the machines come
from the command line (:func:`deepspeed_setup`). Nothing here imports DeepSpeed or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainjob.errors import ValidationError
from trainjob.tools.training_setup import TrainingSetup

if TYPE_CHECKING:
    from trainjob.torch.deepspeed_config import DeepSpeedConfig, DeepSpeedSettings

#: The ds_config keys that change the memory estimate (``deepspeed_setup`` reports these as used).
DEEPSPEED_SIZING_KEYS = (
    "zero_optimization.stage", "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
    "zero_optimization.cpu_offload", "zero_optimization.cpu_offload_params", "fp16.enabled", "bf16.enabled",
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer.type",
)  # fmt: skip


def deepspeed_setup(config: DeepSpeedConfig, **model: Any) -> tuple[TrainingSetup, DeepSpeedSettings, dict[str, Any]]:
    """The :class:`TrainingSetup` of a ds_config on ``model``'s GPUs, its settings, and the keys that set it.

    ``model`` is every TrainingSetup field the config does not give: ``params`` or the shape, ``gpus``, ``nodes``,
    ``tp``, ``pp``, ``seq``, ... The config gives ``zero`` (the stage), ``dtype`` (fp16, bf16, else fp32),
    ``optimizer``, ``micro_batch`` and ``micro_batches`` (gradient accumulation, checked against
    ``train_batch_size`` over the data-parallel ranks). ``offload_optimizer`` alone is ZeRO-Offload (``offload``);
    ``offload_param`` (stage 3) offloads the whole shard, as FSDP2's CPU offload does (``cpu_offload``)::

        setup, settings, used = deepspeed_setup("ds_config.json", params=7e9, gpus=8, nodes=4)
    """
    from trainjob.torch.deepspeed_config import map_deepspeed_config

    taken = sorted({"zero", "dtype", "optimizer", "offload", "cpu_offload", "micro_batch", "micro_batches",
                    "global_batch"} & set(model))  # fmt: skip
    if taken:
        raise ValidationError(taken[0], "comes from the DeepSpeed config; leave it out")
    world = model.get("gpus", 1) * model.get("nodes", 1)
    parallel = model.get("tp", 1) * model.get("pp", 1)
    dp = world // parallel if isinstance(world, int) and isinstance(parallel, int) and parallel >= 1 else 1
    settings = map_deepspeed_config(config, world_size=max(dp, 1))
    used = {key: settings.used[key] for key in DEEPSPEED_SIZING_KEYS if key in settings.used}
    optimizer = "adam"
    if settings.optimizer is not None:
        optimizer = settings.optimizer["type"].lower()
        if optimizer not in ("adam", "adamw", "sgd"):
            raise ValidationError(
                f"{settings.source}: optimizer.type",
                f"the planner knows Adam, AdamW and SGD optimizer states, got {settings.optimizer['type']!r}",
            )
    whole_shard = any(used.get(key) in ("cpu", True) for key in
                      ("zero_optimization.offload_param.device", "zero_optimization.cpu_offload_params"))  # fmt: skip
    if whole_shard and (model.get("layers") is None or model.get("hidden") is None):
        raise ValidationError(
            f"{settings.source}: zero_optimization.offload_param",
            "needs --layers and --hidden to estimate: the GPU then holds only the gathered blocks, whose size they give",
        )
    setup = TrainingSetup(
        **model,
        zero=settings.zero_stage,
        dtype=settings.mixed_precision or "fp32",
        optimizer=optimizer,
        offload=settings.cpu_offload and not whole_shard,
        cpu_offload=whole_shard,
        micro_batch=settings.micro_batch_size,
        micro_batches=settings.gradient_accumulation_steps,
    )
    return setup, settings, used
