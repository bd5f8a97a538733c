"""Training with checkpoints, resumed, resharded or crashed on purpose: run by run_distributed, torchrun or a test."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from dist_workers_common import Indexed, Net, full_params, loader

import trainjob.torch as tt

GLOBAL_BATCH = 8
DATASET_SIZE = 48  # 6 steps per epoch, so runs cross an epoch boundary


class CrashBeforeCommit(tt.Checkpointer):
    """Dies (as a killed process would) after every rank wrote its shards of ``crash_step`` and before the commit."""

    crash_step: int | None = None

    def _commit(self, partial: Path, final: Path, step: int, world_size: int) -> None:
        if step == self.crash_step:
            os._exit(3)
        super()._commit(partial, final, step, world_size)


def run_training(
    directory: str | None,
    total_steps: int,
    save_steps: tuple[int, ...] = (),
    *,
    strategy: str = "fsdp",
    dropout: float = 0.0,
    async_save: bool = False,
    keep_last: int | None = None,
    crash_at: int | None = None,
    crash_before_commit_at: int | None = None,
    report_metrics: bool = False,
) -> dict[str, Any]:
    """Train to ``total_steps`` (resuming from ``directory`` when it has a checkpoint); rank 0 returns the weights."""
    ctx = tt.init()
    tt.seed_everything(0)
    model = tt.prepare_model(Net(dropout=dropout), strategy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    data = tt.prepare_data_loader(loader(Indexed(DATASET_SIZE), GLOBAL_BATCH // ctx.world_size), seed=5)
    ckpt = None
    if directory is not None:
        ckpt = CrashBeforeCommit(directory, keep_last=keep_last, async_save=async_save)
        ckpt.crash_step = crash_before_commit_at
    step = ckpt.resume(model, optimizer, loader=data, scheduler=scheduler) if ckpt else 0
    start = step
    while step < total_steps:
        for _idx, x, y in data:
            loss = F.cross_entropy(model(x), y)
            if step + 1 == crash_at and ctx.rank == ctx.world_size - 1:
                os._exit(17)
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if report_metrics:
                tt.report({"loss": loss, "lr": scheduler.get_last_lr()[0]}, step=step, total_steps=total_steps)
            if ckpt is not None and step in save_steps:
                ckpt.save(step, model, optimizer, loader=data, scheduler=scheduler)
            if step == total_steps:
                break
    if ckpt is not None:
        ckpt.wait()
    params = full_params(model)
    if not ctx.is_main:
        return {}
    return {
        "start": start,
        "params": params,
        "committed": ckpt.steps() if ckpt else [],
        "last_lr": scheduler.get_last_lr()[0],
        "world_size": ctx.world_size,
    }
