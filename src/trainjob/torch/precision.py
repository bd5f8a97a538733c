"""Mixed precision: names to dtypes, autocast, and a GradScaler that is on only where fp16 needs it.

``"bf16"`` keeps float32's exponent range, so gradients need no scaling; ``"fp16"`` does, and
:func:`grad_scaler` returns an enabled :class:`torch.amp.GradScaler` only then. The same loop is correct for
``None``, ``"bf16"`` and ``"fp16"``::

    scaler = grad_scaler(mixed_precision)
    with autocast(mixed_precision):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)          # before clipping, so the threshold applies to true gradients
    clip_grad_norm_(model, 1.0)
    scaler.step(optimizer)              # skipped when fp16 gradients overflowed
    scaler.update()
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Literal

import torch
from torch import nn

from trainjob.errors import ValidationError

__all__ = ["Precision", "autocast", "autocast_forward", "grad_scaler", "precision_dtype"]

Precision = Literal["bf16", "fp16"]

_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


def precision_dtype(mixed_precision: Precision | None, *, field: str = "mixed_precision") -> torch.dtype | None:
    """``"bf16"`` -> ``torch.bfloat16``, ``"fp16"`` -> ``torch.float16``, ``None`` -> ``None``."""
    if mixed_precision is None:
        return None
    try:
        return _DTYPES[mixed_precision]
    except (KeyError, TypeError):
        raise ValidationError(field, f"must be one of None, 'bf16', 'fp16', got {mixed_precision!r}") from None


def _device_type(device: torch.device | str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device).type


def autocast(mixed_precision: Precision | None, device: torch.device | str | None = None) -> Any:
    """``torch.autocast`` for the named precision, or a no-op context for ``None``::

    with autocast("bf16"):
        logits = model(x)
    """
    dtype = precision_dtype(mixed_precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(_device_type(device), dtype=dtype)


def grad_scaler(mixed_precision: Precision | None, device: torch.device | str | None = None) -> torch.amp.GradScaler:
    """A :class:`torch.amp.GradScaler` enabled for ``"fp16"`` and a pass-through otherwise.

    Checkpoint it with the model (``Checkpointer.save(..., scaler=scaler)``) so the scale survives restarts::

        scaler = grad_scaler("fp16")
    """
    dtype = precision_dtype(mixed_precision)
    return torch.amp.GradScaler(_device_type(device), enabled=dtype is torch.float16)


def _to_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_to_float32(v) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(_to_float32(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_float32(v) for k, v in value.items()}
    return value


def autocast_forward(module: nn.Module, mixed_precision: Precision, device: torch.device | str) -> nn.Module:
    """Run ``module.forward`` under autocast and hand floating outputs back in float32 (for the loss).

    The module keeps its class and parameter names, so state dicts and checkpoints are unchanged::

        model = autocast_forward(model, "bf16", "cpu")
    """
    dtype = precision_dtype(mixed_precision)
    assert dtype is not None
    forward = module.forward
    device_type = _device_type(device)

    @functools.wraps(forward)
    def forward_in_autocast(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            out = forward(*args, **kwargs)
        return _to_float32(out)

    module.forward = forward_in_autocast  # type: ignore[method-assign]
    return module

