"""Gradient accumulation that communicates once per optimizer step, not once per micro-batch.

On every micro-step but the last, gradients only accumulate locally: DDP's ``no_sync()``, FSDP2's
``set_requires_gradient_sync(False)``. The last micro-step's backward reduces the summed gradients, so
``micro_steps`` micro-batches of ``b`` give the same update as one batch of ``micro_steps * b`` when each
micro-batch loss is divided by ``micro_steps``. A :class:`~trainjob.torch.parallel.ParallelModel` without
pipelining is handled part by part; with pipelining PyTorch's schedule reduces once per ``train_step`` itself::

    accumulation = GradientAccumulation(model, micro_steps=4)
    for i, (x, y) in enumerate(loader):
        with accumulation.micro_step(i) as last:
            loss = loss_fn(model(x), y) / accumulation.micro_steps
            loss.backward()
        if last:
            optimizer.step()
            optimizer.zero_grad()
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from torch import nn

from trainjob.errors import ValidationError

__all__ = ["GradientAccumulation"]


def _fsdp_module_class() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return None
    return FSDPModule


def _sync_roots(model: nn.Module) -> list[nn.Module]:
    """The modules whose gradient reduction a micro-step switches: the model, or a ``ParallelModel``'s parts."""
    compose = sys.modules.get("trainjob.torch.parallel.compose")  # not loaded: no ParallelModel exists
    if compose is not None and isinstance(model, compose.ParallelModel) and model.pipeline is None:
        return list(model.parts)
    return [model]


class GradientAccumulation:
    """Skip gradient reduction on all but every ``micro_steps``-th micro-step of a model from ``prepare_model``."""

    def __init__(self, model: nn.Module, micro_steps: int) -> None:
        if isinstance(micro_steps, bool) or not isinstance(micro_steps, int) or micro_steps < 1:
            raise ValidationError("micro_steps", f"must be an integer >= 1, got {micro_steps!r}")
        self.model = model
        self.micro_steps = micro_steps

    def is_last(self, index: int) -> bool:
        """True when micro-batch ``index`` (counted from 0) completes an optimizer step."""
        return (index + 1) % self.micro_steps == 0

    @contextlib.contextmanager
    def micro_step(self, index: int) -> Iterator[bool]:
        """Context for forward and backward of micro-batch ``index``; yields whether to step the optimizer."""
        last = self.is_last(index)
        if last:
            yield last
            return
        fsdp = _fsdp_module_class()
        with contextlib.ExitStack() as stack:
            for root in _sync_roots(self.model):
                if isinstance(root, nn.parallel.DistributedDataParallel):
                    stack.enter_context(root.no_sync())
                elif fsdp is not None and isinstance(root, fsdp):
                    root.set_requires_gradient_sync(False)
                    stack.callback(root.set_requires_gradient_sync, True)
            yield last
