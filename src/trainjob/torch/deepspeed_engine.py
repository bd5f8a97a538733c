"""Train from a ds_config with trainjob: the optimizer, the scheduler and a thin engine with DeepSpeed's loop.

A DeepSpeed script changes one call; the loop stays as it was::

    model_engine, optimizer, _, lr_scheduler = deepspeed_initialize(model=model, config="ds_config.json")
    for batch in loader:                       # micro-batches of train_micro_batch_size_per_gpu
        loss = loss_fn(model_engine(x), y)
        model_engine.backward(loss)            # divided by gradient_accumulation_steps, fp16-scaled
        model_engine.step()                    # at each accumulation boundary: unscale, clip, step, schedule

What the engine does, in trainjob's own calls (write them out to take control of a step):

===============================  ===================================================================================
DeepSpeed                        trainjob
===============================  ===================================================================================
``deepspeed.initialize``         ``prepare_model(model, deepspeed_config=cfg)``, ``deepspeed_optimizer(model, cfg)``,
                                 ``deepspeed_scheduler(optimizer, cfg)``
``model_engine(x)`` on a         forward inside ``GradientAccumulation(model, steps).micro_step(i)``, which skips
non-boundary micro-batch         the gradient reduction (DDP ``no_sync``, FSDP ``set_requires_gradient_sync``)
``model_engine.backward(loss)``  ``scaler.scale(loss / steps).backward()`` (``grad_scaler`` is a no-op unless fp16)
``model_engine.step()``          ``scaler.unscale_(opt)``; ``clip_grad_norm_(model, c)``; ``scaler.step(opt)``;
                                 ``scaler.update()``; ``lr_scheduler.step()`` unless fp16 overflowed;
                                 ``opt.zero_grad()``
``save_checkpoint``              ``tt.Checkpointer(dir).save(step, engine.module, optimizer)``
===============================  ===================================================================================

The learning-rate schedules follow DeepSpeed's formulas: the learning rate starts at the warm-up minimum and moves
once per optimizer step, log-shaped (``warmup_type: "log"``, the default) or linear during warm-up.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from trainjob.errors import ValidationError
from trainjob.torch.accumulate import GradientAccumulation
from trainjob.torch.clip import clip_grad_norm_
from trainjob.torch.deepspeed_config import DeepSpeedConfig, DeepSpeedSettings, _is_auto, map_deepspeed_config

__all__ = ["TrainingEngine", "deepspeed_initialize", "deepspeed_optimizer", "deepspeed_scheduler"]

_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")
_SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")


def _settings(config: DeepSpeedConfig | DeepSpeedSettings) -> DeepSpeedSettings:
    return config if isinstance(config, DeepSpeedSettings) else map_deepspeed_config(config)


def _params(block: dict[str, Any], overrides: dict[str, Any], defaults: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """Block params with "auto" replaced by ``overrides``, else by ``defaults``.

    ``defaults=None`` leaves an unfilled "auto" out (the torch default applies); otherwise an "auto" with no default
    is an error naming the keyword to pass.
    """
    merged = {**(defaults or {}), **{k: v for k, v in block["params"].items() if not _is_auto(v)}, **overrides}
    for name, value in block["params"].items():
        if _is_auto(value) and name not in merged and defaults is not None:
            raise ValidationError(f"{where}.params.{name}", f'is "auto": pass {name}=... to say what it is')
    return merged


def deepspeed_optimizer(
    model: nn.Module, config: DeepSpeedConfig | DeepSpeedSettings, **overrides: Any
) -> torch.optim.Optimizer:
    """The torch optimizer a ds_config's ``optimizer`` block names, over ``model``'s (prepared) parameters.

    ``Adam`` is AdamW (decoupled weight decay) unless ``adam_w_mode`` is false, as in DeepSpeed; ``weight_decay``
    defaults to 0. ``overrides`` fill ``"auto"`` values (``lr=3e-4``); an "auto" without one takes torch's default::

        optimizer = deepspeed_optimizer(model, "ds_config.json")
    """
    settings = _settings(config)
    block = settings.optimizer
    if block is None:
        raise ValidationError(
            f"{settings.source}: optimizer", "is missing: add an optimizer block or build the optimizer yourself"
        )
    kind = block["type"].lower()
    params = _params(block, overrides, None, f"{settings.source}: optimizer")
    where = f"{settings.source}: optimizer.params"
    try:
        if kind in ("adam", "adamw"):
            adam_w = params.pop("adam_w_mode", True) if kind == "adam" else True
            params.pop("torch_adam", None)
            params.setdefault("weight_decay", 0.0)
            cls = torch.optim.AdamW if adam_w else torch.optim.Adam
            if "betas" in params:
                params["betas"] = tuple(params["betas"])
            return cls(model.parameters(), **params)
        if kind == "sgd":
            return torch.optim.SGD(model.parameters(), **{"lr": 1e-3, **params})
        if kind == "adagrad":
            return torch.optim.Adagrad(model.parameters(), **params)
    except TypeError as exc:  # an unexpected keyword: name it with what the optimizer takes
        raise ValidationError(where, f"{exc}") from None
    raise ValidationError(
        f"{settings.source}: optimizer.type", f"must be one of {', '.join(_OPTIMIZERS)}, got {block['type']!r}"
    )


class _ScheduleLR(torch.optim.lr_scheduler.LRScheduler):
    """Learning rates from ``rates(iteration)``; iteration -1 before the first step, as DeepSpeed counts."""

    def __init__(self, optimizer: torch.optim.Optimizer, rates: Callable[[int], list[float]]) -> None:
        self._rates = rates
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        return self._rates(self.last_epoch - 1)


def _warmup_fraction(iteration: int, warmup: int, kind: str) -> float:
    if iteration < 0:
        return 0.0
    if kind == "linear":
        return iteration / warmup
    return math.log(iteration + 1) / math.log(warmup)


def deepspeed_scheduler(
    optimizer: torch.optim.Optimizer, config: DeepSpeedConfig | DeepSpeedSettings, **overrides: Any
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The ``scheduler`` block as a torch LR scheduler (None without one); step it once per optimizer step.

    ``WarmupLR`` rises from ``warmup_min_lr`` to ``warmup_max_lr`` (default: the optimizer's lr) over
    ``warmup_num_steps`` and stays; ``WarmupDecayLR`` then falls linearly to 0 at ``total_num_steps``;
    ``WarmupCosineLR`` scales the optimizer's lr by a ratio from ``warmup_min_ratio`` to 1, then down a cosine to
    ``cos_min_ratio``. ``overrides`` fill "auto" values (``total_num_steps=10_000``)::

        lr_scheduler = deepspeed_scheduler(optimizer, "ds_config.json", total_num_steps=10_000)
    """
    settings = _settings(config)
    block = settings.scheduler
    if block is None:
        return None
    kind = block["type"]
    base = [group["lr"] for group in optimizer.param_groups]
    defaults: dict[str, Any] = {"warmup_num_steps": 1000, "warmup_type": "log"}
    if kind in ("WarmupLR", "WarmupDecayLR"):
        defaults |= {"warmup_min_lr": 0.0, "warmup_max_lr": None}
    elif kind == "WarmupCosineLR":
        defaults |= {"warmup_min_ratio": 0.0, "cos_min_ratio": 0.0001}
    else:
        raise ValidationError(
            f"{settings.source}: scheduler.type", f"must be one of {', '.join(_SCHEDULERS)}, got {kind!r}"
        )
    p = _params(block, overrides, defaults, f"{settings.source}: scheduler")
    known = set(defaults) | ({"total_num_steps"} if kind != "WarmupLR" else set())
    extra = sorted(set(p) - known)
    if extra:
        raise ValidationError(
            f"{settings.source}: scheduler.params.{extra[0]}", f"is not a {kind} parameter; it takes {', '.join(sorted(known))}"
        )
    if kind != "WarmupLR" and "total_num_steps" not in p:
        raise ValidationError(f"{settings.source}: scheduler.params.total_num_steps", f"is needed by {kind}")
    warmup = max(2, int(p["warmup_num_steps"]))
    shape = p["warmup_type"]

    if kind == "WarmupCosineLR":
        total = int(p["total_num_steps"])

        def cosine(iteration: int) -> list[float]:
            if iteration < 0:
                return [0.0 for _ in base]  # DeepSpeed starts this schedule at 0, not at warmup_min_ratio
            if iteration < warmup:
                ratio = p["warmup_min_ratio"] + (1 - p["warmup_min_ratio"]) * _warmup_fraction(iteration, warmup, shape)
            else:
                progress = min(1.0, (iteration - warmup + 1) / max(1, total - warmup))
                ratio = max(0.0, p["cos_min_ratio"] + (1 - p["cos_min_ratio"]) * (1 + math.cos(math.pi * progress)) / 2)
            return [lr * ratio for lr in base]

        return _ScheduleLR(optimizer, cosine)

    low = float(p["warmup_min_lr"])
    highs = base if p["warmup_max_lr"] is None else [float(p["warmup_max_lr"])] * len(base)
    total = int(p.get("total_num_steps", 0))

    def warmup_then(iteration: int) -> list[float]:
        if iteration < warmup:
            gamma = _warmup_fraction(iteration, warmup, shape)
        elif kind == "WarmupDecayLR":
            gamma = max(0.0, (total - iteration) / max(1.0, total - warmup))
        else:
            gamma = 1.0
        return [low + (high - low) * gamma for high in highs]

    return _ScheduleLR(optimizer, warmup_then)


class TrainingEngine:
    """DeepSpeed's ``model_engine`` calls over a prepared model: ``engine(x)``, ``backward(loss)``, ``step()``.

    ``module`` is the model from ``prepare_model``; checkpoint it and ``optimizer`` with ``tt.Checkpointer``.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        settings: DeepSpeedSettings,
        lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        from trainjob.torch.env import init

        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.settings = settings
        self.device = init().device
        self.accumulation = GradientAccumulation(module, settings.gradient_accumulation_steps)
        self.scaler = _scaler(settings, self.device, module)
        self.micro_steps = 0
        self.global_steps = 0
        self.skipped_steps = 0
        self._no_sync: contextlib.ExitStack | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Forward; on a micro-batch that does not end a step, gradient reduction is switched off until backward."""
        if self._no_sync is None and not self.is_gradient_accumulation_boundary():
            self._no_sync = contextlib.ExitStack()
            self._no_sync.enter_context(self.accumulation.micro_step(self.micro_steps))
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss / gradient_accumulation_steps``, scaled for fp16."""
        self.scaler.scale(loss / self.settings.gradient_accumulation_steps).backward()
        if self._no_sync is not None:
            self._no_sync.close()
            self._no_sync = None

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the current micro-batch ends an optimizer step."""
        return self.accumulation.is_last(self.micro_steps)

    def step(self) -> None:
        """Count the micro-batch; at a boundary clip, step the optimizer and scheduler, and zero the gradients."""
        if self.is_gradient_accumulation_boundary():
            self.scaler.unscale_(self.optimizer)
            if self.settings.gradient_clipping is not None:
                clip_grad_norm_(self.module, self.settings.gradient_clipping)
            scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
            self.scaler.step(self.optimizer)
            self.scaler.update()
            overflowed = scale is not None and self.scaler.get_scale() < scale
            if overflowed:
                self.skipped_steps += 1
            elif self.lr_scheduler is not None:
                self.lr_scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.global_steps += 1
        self.micro_steps += 1

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.settings.micro_batch_size

    def gradient_accumulation_steps(self) -> int:
        return self.settings.gradient_accumulation_steps

    def train_batch_size(self) -> int:
        return self.settings.train_batch_size

    def train(self, mode: bool = True) -> TrainingEngine:
        self.module.train(mode)
        return self

    def eval(self) -> TrainingEngine:
        return self.train(False)

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.module.parameters()


def _scaler(settings: DeepSpeedSettings, device: torch.device, module: nn.Module) -> torch.amp.GradScaler:
    """fp16's loss scaler; with sharded gradients (FSDP) the overflow check is agreed across ranks."""
    scaling = settings.loss_scaling
    if scaling is None:
        return torch.amp.GradScaler(device.type, enabled=False)
    # A fixed scale never grows; torch's scalers still halve it on an overflow, skipping that step.
    options = {"init_scale": scaling.init_scale, "growth_interval": scaling.growth_interval if scaling.dynamic else 2**62}
    if settings.strategy == "fsdp":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type, **options)
    return torch.amp.GradScaler(device.type, **options)


def deepspeed_initialize(
    model: nn.Module,
    config: DeepSpeedConfig,
    *,
    model_parameters: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    **overrides: Any,
) -> tuple[TrainingEngine, torch.optim.Optimizer, None, torch.optim.lr_scheduler.LRScheduler | None]:
    """``deepspeed.initialize``'s shape: ``(engine, optimizer, None, lr_scheduler)``, built the trainjob way.

    The model is prepared as the config says (:func:`trainjob.torch.prepare.prepare_model`); the optimizer and
    scheduler come from the config's blocks unless given (``model_parameters`` is accepted and unused: the
    prepared model's parameters are the ones to optimize). ``overrides`` fill "auto" optimizer and scheduler
    values. There is no data loader: wrap yours with ``tt.prepare_data_loader`` at ``engine.train_micro_batch_size_
    per_gpu()`` per rank::

        engine, optimizer, _, lr_scheduler = deepspeed_initialize(model, "ds_config.json")
    """
    from trainjob.torch.env import init
    from trainjob.torch.prepare import prepare_model

    del model_parameters
    settings = map_deepspeed_config(config, world_size=init().world_size)
    prepared = prepare_model(model, deepspeed_config=settings)
    if optimizer is None:
        optimizer_keys = {"lr", "betas", "eps", "weight_decay", "momentum", "adam_w_mode"}
        optimizer = deepspeed_optimizer(prepared, settings, **{k: v for k, v in overrides.items() if k in optimizer_keys})
        overrides = {k: v for k, v in overrides.items() if k not in optimizer_keys}
    if lr_scheduler is None:
        lr_scheduler = deepspeed_scheduler(optimizer, settings, **overrides)
    return TrainingEngine(prepared, optimizer, settings, lr_scheduler), optimizer, None, lr_scheduler
