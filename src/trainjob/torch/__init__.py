"""The few calls a training script needs for DDP and FSDP, checkpoints, metrics and restarts.

::

    import trainjob.torch as tt

    ctx = tt.init()                                    # torchrun's env, or one process on its own
    tt.seed_everything(0)                              # same weights everywhere, per-rank augmentation
    model = tt.prepare_model(Net(), "fsdp", mixed_precision="bf16")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = tt.prepare_data_loader(DataLoader(dataset, batch_size=32, shuffle=True))
    ckpt = tt.Checkpointer("checkpoints", keep_last=2)
    step = ckpt.resume(model, optimizer, loader=loader)
    while step < total_steps:
        for x, y in loader:                            # sharded, reshuffled each epoch, on ctx.device
            loss = loss_fn(model(x), y)
            loss.backward()
            tt.clip_grad_norm_(model, 1.0)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            tt.report({"loss": loss}, step=step, total_steps=total_steps)
            if step % 100 == 0:
                ckpt.save(step, model, optimizer, loader=loader)
            if step == total_steps:
                break
    tt.shutdown()

Elastic jobs pass ``tt.Checkpointer(..., elastic=tt.ElasticConfig(lr_scaling="linear"))`` to follow shrinks
and grows (:mod:`trainjob.torch.elastic`). Tensor, pipeline and 3-D parallelism live in :mod:`trainjob.torch.parallel` (``prepare_model(parallel=...)``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Submodules load on first use: importing trainjob.torch costs little more than importing torch.
_EXPORTS = {
    "CheckpointError": "checkpoint",
    "Checkpointer": "checkpoint",
    "DiskFullError": "checkpoint",
    "DistContext": "env",
    "DistributedDataLoader": "data",
    "ElasticConfig": "elastic",
    "TrainingEngine": "deepspeed_engine",
    "GradientAccumulation": "accumulate",
    "COMM_HOOKS": "comm_hooks",
    "apply_activation_checkpointing": "wrap",
    "apply_ddp": "wrap",
    "apply_fsdp": "wrap",
    "autocast": "precision",
    "clip_grad_norm_": "clip",
    "context": "env",
    "deepspeed_initialize": "deepspeed_engine",
    "deepspeed_optimizer": "deepspeed_engine",
    "deepspeed_scheduler": "deepspeed_engine",
    "get_logger": "log",
    "grad_norm": "clip",
    "grad_scaler": "precision",
    "init": "env",
    "map_deepspeed_config": "deepspeed_config",
    "move_to_device": "data",
    "prepare_data_loader": "data",
    "prepare_model": "prepare",
    "register_comm_hook": "comm_hooks",
    "print0": "log",
    "report": "metrics",
    "seed_everything": "seed",
    "select_blocks": "wrap",
    "shutdown": "env",
}

__all__ = [
    "COMM_HOOKS",
    "CheckpointError",
    "Checkpointer",
    "DiskFullError",
    "DistContext",
    "DistributedDataLoader",
    "ElasticConfig",
    "GradientAccumulation",
    "TrainingEngine",
    "apply_activation_checkpointing",
    "apply_ddp",
    "apply_fsdp",
    "autocast",
    "clip_grad_norm_",
    "context",
    "deepspeed_initialize",
    "deepspeed_optimizer",
    "deepspeed_scheduler",
    "get_logger",
    "grad_norm",
    "grad_scaler",
    "init",
    "map_deepspeed_config",
    "move_to_device",
    "prepare_data_loader",
    "prepare_model",
    "print0",
    "register_comm_hook",
    "report",
    "seed_everything",
    "select_blocks",
    "shutdown",
]

if TYPE_CHECKING:
    from trainjob.torch.accumulate import GradientAccumulation
    from trainjob.torch.checkpoint import Checkpointer, CheckpointError, DiskFullError
    from trainjob.torch.clip import clip_grad_norm_, grad_norm
    from trainjob.torch.comm_hooks import COMM_HOOKS, register_comm_hook
    from trainjob.torch.data import DistributedDataLoader, move_to_device, prepare_data_loader
    from trainjob.torch.deepspeed_config import map_deepspeed_config
    from trainjob.torch.deepspeed_engine import (
        TrainingEngine,
        deepspeed_initialize,
        deepspeed_optimizer,
        deepspeed_scheduler,
    )
    from trainjob.torch.elastic import ElasticConfig
    from trainjob.torch.env import DistContext, context, init, shutdown
    from trainjob.torch.log import get_logger, print0
    from trainjob.torch.metrics import report
    from trainjob.torch.precision import autocast, grad_scaler
    from trainjob.torch.prepare import prepare_model
    from trainjob.torch.seed import seed_everything
    from trainjob.torch.wrap import apply_activation_checkpointing, apply_ddp, apply_fsdp, select_blocks


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainjob.torch' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"trainjob.torch.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
