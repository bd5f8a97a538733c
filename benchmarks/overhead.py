"""Step time of a loop built from trainjob.torch against a hand-written DDP loop, same processes, same model.

``prepared``: ``prepare_model(model, "ddp")``, ``prepare_data_loader`` (sharding, automatic ``set_epoch``,
device moves) and ``GradientAccumulation`` around every step. ``hand-written``: ``DistributedDataParallel`` with
its defaults, a ``DataLoader`` with a ``DistributedSampler``, ``set_epoch`` and ``.to(device)`` by hand.
Both run in the same processes, in alternating rounds so machine noise hits both alike; the figure is the
median of the per-round ratios (target: at most 1.02)::

    python benchmarks/overhead.py --nproc 2 --rounds 12 --steps 15
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainjob.torch as tt


def _model(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _prepared_loop(width: int, depth: int, dataset: TensorDataset, batch: int):
    model = tt.prepare_model(_model(width, depth), "ddp")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = tt.prepare_data_loader(DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True))
    accumulation = tt.GradientAccumulation(model, micro_steps=1)

    def run(steps: int) -> None:
        done = 0
        while done < steps:
            for i, (x, y) in enumerate(loader):
                with accumulation.micro_step(i):
                    F.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
                done += 1
                if done == steps:
                    return

    return run


def _hand_written_loop(width: int, depth: int, dataset: TensorDataset, batch: int, device: torch.device):
    model = nn.parallel.DistributedDataParallel(_model(width, depth).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    sampler = DistributedSampler(dataset, shuffle=True, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True)
    epoch = 0

    def run(steps: int) -> None:
        nonlocal epoch
        done = 0
        while done < steps:
            sampler.set_epoch(epoch)
            epoch += 1
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
                done += 1
                if done == steps:
                    return

    return run


def measure(width: int, depth: int, batch: int, steps: int, rounds: int) -> dict[str, Any]:
    """Per-rank entry point: median seconds per step of both loops over ``rounds`` alternating rounds."""
    ctx = tt.init()
    gen = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(4096, width, generator=gen), torch.randint(0, 10, (4096,), generator=gen))
    loops = {
        "prepared": _prepared_loop(width, depth, dataset, batch),
        "hand_written": _hand_written_loop(width, depth, dataset, batch, ctx.device),
    }
    for run in loops.values():  # warm-up: allocator, DDP's first-iteration bucket rebuild
        run(3)
    per_step: dict[str, list[float]] = {name: [] for name in loops}
    for index in range(rounds):
        order = list(loops) if index % 2 == 0 else list(reversed(loops))
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            loops[name](steps)
            dist.barrier()
            per_step[name].append((time.perf_counter() - start) / steps)
    # Each round's ratio compares two runs made back to back, so a slow phase of the machine cancels out.
    ratios = [p / h for p, h in zip(per_step["prepared"], per_step["hand_written"], strict=True)]
    return {
        "prepared": statistics.median(per_step["prepared"]),
        "hand_written": statistics.median(per_step["hand_written"]),
        "ratio": statistics.median(ratios),
        "ratio_spread": [min(ratios), max(ratios)],
        "world_size": ctx.world_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64, help="per process")
    parser.add_argument("--steps", type=int, default=15, help="steps per round")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()

    from trainjob.torch.testing import run_distributed

    sys.path.insert(0, str(Path(__file__).parent))  # spawned ranks import this file as the module "overhead"
    kwargs = {k: getattr(args, k) for k in ("width", "depth", "batch", "steps", "rounds")}
    result = run_distributed("overhead:measure", nproc=args.nproc, kwargs=kwargs, timeout=600)[0]
    print(f"processes: {args.nproc}  model: {args.depth}x{args.width} MLP  batch/process: {args.batch}")
    print(f"hand-written DDP loop  {result['hand_written'] * 1e3:8.2f} ms/step (median of {args.rounds} rounds)")
    print(f"trainjob.torch loop    {result['prepared'] * 1e3:8.2f} ms/step")
    low, high = result["ratio_spread"]
    print(f"ratio                  {result['ratio']:8.3f}  (median of per-round ratios, range {low:.3f}-{high:.3f}; target <= 1.02)")
    print(json.dumps({"benchmark": "overhead", "nproc": args.nproc, **kwargs, **result}))


if __name__ == "__main__":
    main()
