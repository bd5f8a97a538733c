"""Seed 003's DeepSpeed training script, made to run on CPU: `deepspeed.initialize` with a ds_config, then the
`model_engine.backward(loss)` / `model_engine.step()` loop. Under trainjob's torch-distributed runtime torchrun sets
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which DeepSpeed reads; no `deepspeed` launcher or hostfile.

    torchrun --nproc-per-node 2 examples/deepspeed/train.py --deepspeed_config examples/deepspeed/ds_zero3_offload.json
    trainjob apply -f examples/deepspeed/trainjob.yaml

The model is a small classifier on fixed synthetic data instead of Llama-2-70B; every step uses the same global
batch whatever the world size (each rank takes its slice), so the printed loss can be compared across layouts.
The same config also trains without DeepSpeed: `tt.deepspeed_initialize(model, config)` (see --trainjob).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported: no CUDA probing
os.environ.setdefault("DS_BUILD_OPS", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

FEATURES, CLASSES = 32, 8


def make_model() -> nn.Module:
    torch.manual_seed(0)  # the same weights on every rank and in every layout
    return nn.Sequential(
        nn.Linear(FEATURES, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, CLASSES)
    )


def make_data(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, FEATURES, generator=gen)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed_config", "--deepspeed-config", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--result", type=Path, help="rank 0 writes the per-step losses here as JSON")
    parser.add_argument("--trainjob", action="store_true", help="train with trainjob.torch instead of DeepSpeed")
    parser.add_argument("--deepspeed", action="store_true", help="accepted for the seed's command line")
    parser.add_argument("--local_rank", type=int, default=-1, help="accepted for the deepspeed launcher")
    args = parser.parse_args()

    if args.trainjob:
        from trainjob.torch.deepspeed_engine import deepspeed_initialize

        model_engine, _, _, _ = deepspeed_initialize(make_model(), args.deepspeed_config)
        device = model_engine.device
    else:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        model = make_model()
        model_engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=str(args.deepspeed_config)
        )
        device = model_engine.device
    rank, world = dist.get_rank(), dist.get_world_size()
    micro = model_engine.train_micro_batch_size_per_gpu()
    accumulation = model_engine.gradient_accumulation_steps()
    dtype = next(p for p in model_engine.module.parameters()).dtype
    x, y = make_data(args.steps * accumulation * micro * world)

    losses = []
    for step in range(args.steps):
        step_loss = torch.zeros(())
        for k in range(accumulation):
            start = ((step * accumulation + k) * world + rank) * micro
            inputs = x[start : start + micro].to(device)
            if not args.trainjob and dtype != torch.float32:
                inputs = inputs.to(dtype)  # DeepSpeed's fp16/bf16 keeps the module in that dtype
            outputs = model_engine(inputs)
            loss = F.cross_entropy(outputs.float(), y[start : start + micro].to(device))
            model_engine.backward(loss)
            model_engine.step()
            step_loss += loss.detach().float().cpu() / accumulation
        dist.all_reduce(step_loss)
        losses.append(step_loss.item() / world)
        if rank == 0:
            print(f"step {step + 1}/{args.steps} loss={losses[-1]:.6f}", flush=True)
    if rank == 0 and args.result:
        args.result.write_text(json.dumps({"world_size": world, "micro": micro, "accumulation": accumulation,
                                           "losses": losses}))  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
