"""Workers for test_deepspeed_engine.py: a ds_config's engine against the plain trainjob calls it maps to."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from dist_workers_common import CLASSES, FEATURES, Net

import trainjob.torch as tt
from trainjob.torch.deepspeed_config import map_deepspeed_config
from trainjob.torch.deepspeed_engine import deepspeed_initialize
from trainjob.torch.wrap import apply_fsdp, select_blocks


def _data(steps: int, micro: int, accumulation: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    rows = steps * accumulation * micro * world
    x = torch.randn(rows, FEATURES, generator=gen)
    return x, (x[:, :CLASSES] * 3).argmax(dim=1)  # learnable labels: the loss falls


def _shard(x: torch.Tensor, y: torch.Tensor, index: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of global micro-batch ``index``."""
    world, rank = dist.get_world_size(), dist.get_rank()
    start = (index * world + rank) * micro
    return x[start : start + micro], y[start : start + micro]


def _mean(value: torch.Tensor) -> float:
    value = value.detach().float().clone()
    dist.all_reduce(value)
    return value.item() / dist.get_world_size()


def _train(engine: Any, steps: int) -> list[float]:
    """DeepSpeed's loop over ``steps`` optimizer steps; the global mean loss of each step's last micro-batch."""
    micro, accumulation = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    x, y = _data(steps, micro, accumulation, dist.get_world_size())
    losses = []
    for index in range(steps * accumulation):
        xb, yb = _shard(x, y, index, micro)
        loss = F.cross_entropy(engine(xb), yb)
        engine.backward(loss)
        engine.step()
        if (index + 1) % accumulation == 0:
            losses.append(_mean(loss))
    return losses


def engine_losses(config: dict[str, Any], steps: int) -> list[float]:
    """Train with deepspeed_initialize and DeepSpeed's loop."""
    torch.manual_seed(0)
    engine, _, _, _ = deepspeed_initialize(Net(), config)
    losses = _train(engine, steps)
    assert engine.global_steps == steps
    return losses


def plain_losses(
    steps: int, micro: int, accumulation: int, strategy: str, zero_stage: int, mixed_precision: str | None,
    cpu_offload: bool, clipping: float | None, lr: float, weight_decay: float,
) -> list[float]:  # fmt: skip
    """The same run written with trainjob's own calls, as the mapping table says a ds_config becomes."""
    torch.manual_seed(0)
    model = Net()
    if strategy == "fsdp" and zero_stage != 3:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}[mixed_precision]
        apply_fsdp(select_blocks(model), [model], zero_stage=zero_stage, param_dtype=dtype,
                   output_dtype=torch.float32 if dtype else None, cpu_offload=cpu_offload)  # fmt: skip
    else:
        model = tt.prepare_model(model, strategy, mixed_precision=mixed_precision, cpu_offload=cpu_offload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    accumulate = tt.GradientAccumulation(model, micro_steps=accumulation)
    x, y = _data(steps, micro, accumulation, dist.get_world_size())
    losses = []
    for index in range(steps * accumulation):
        xb, yb = _shard(x, y, index, micro)
        with accumulate.micro_step(index) as last:
            loss = F.cross_entropy(model(xb), yb)
            (loss / accumulation).backward()
        if last:
            if clipping is not None:
                tt.clip_grad_norm_(model, clipping)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(_mean(loss))
    return losses


def compare_all(scenarios: dict[str, tuple[dict[str, Any], dict[str, Any] | None]], steps: int) -> dict[str, Any]:
    """For each scenario, the engine's losses and (when plain settings are given) the plain calls' losses."""
    results: dict[str, Any] = {}
    for name, (config, plain) in scenarios.items():
        results[name] = {
            "engine": engine_losses(config, steps),
            "plain": plain_losses(steps, **plain) if plain is not None else None,
            "settings": map_deepspeed_config(config),
        }
    return results


def fp16_run(config: dict[str, Any], steps: int) -> dict[str, Any]:
    """An fp16 run: its losses, skipped steps and final loss scale (which every rank must agree on)."""
    torch.manual_seed(0)
    engine, _, _, _ = deepspeed_initialize(Net(), config)
    losses = _train(engine, steps)
    return {"losses": losses, "skipped": engine.skipped_steps, "scale": engine.scaler.get_scale(),
            "type": type(engine.scaler).__name__}  # fmt: skip


def block_weight_after_forward(config: dict[str, Any]) -> str:
    """The type of a block's weight between forward and backward: FSDP2 reshards it after forward only for ZeRO-3."""
    torch.manual_seed(0)
    engine, _, _, _ = deepspeed_initialize(Net(), config)
    engine(torch.randn(engine.train_micro_batch_size_per_gpu(), FEATURES)).sum()
    net = getattr(engine.module, "module", engine.module)  # DDP holds the model as .module
    return type(net.blocks[0].linear.weight).__name__
