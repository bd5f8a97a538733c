"""Step time of a loop built from trainjob.torch against a hand-written DDP loop, same processes, same model.

``prepared``: ``prepare_model(model, "ddp")``, ``prepare_data_loader`` (sharding, automatic ``set_epoch``,
device moves) and ``GradientAccumulation`` around every step. ``hand-written``: ``DistributedDataParallel`` with
its defaults, a ``DataLoader`` with a ``DistributedSampler``, ``set_epoch`` and ``.to(device)`` by hand.
All run in the same processes, in rotating rounds so machine noise hits each alike; the figure is the median
of the per-round ratios (target: at most 1.02). A second copy of the hand-written loop measures the noise
floor of the machine in the same run::

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
    """Per-rank entry point: seconds per step of each loop over ``rounds`` rotating rounds, and their ratios."""
    ctx = tt.init()
    gen = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(4096, width, generator=gen), torch.randint(0, 10, (4096,), generator=gen))
    loops = {
        "prepared": _prepared_loop(width, depth, dataset, batch),
        "hand_written": _hand_written_loop(width, depth, dataset, batch, ctx.device),
        # The same hand-written loop again: its ratio to the first is this machine's noise floor.
        "control": _hand_written_loop(width, depth, dataset, batch, ctx.device),
    }
    for run in loops.values():  # warm-up: allocator, DDP's first-iteration bucket rebuild
        run(3)
    per_step: dict[str, list[float]] = {name: [] for name in loops}
    cpu_per_step: dict[str, list[float]] = {name: [] for name in loops}
    for index in range(rounds):
        order = list(loops)[index % 3 :] + list(loops)[: index % 3]  # rotate who goes first
        for name in order:
            dist.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            loops[name](steps)
            cpu_per_step[name].append((time.process_time() - cpu_start) / steps)
            dist.barrier()
            per_step[name].append((time.perf_counter() - start) / steps)

    def paired_ratio(name: str, times: dict[str, list[float]] = per_step) -> float:
        # Each round's ratio compares runs made back to back, so a slow phase of the machine mostly cancels.
        return statistics.median(a / b for a, b in zip(times[name], times["hand_written"], strict=True))

    return {
        "step_s": {name: statistics.median(times) for name, times in per_step.items()},
        "best_step_s": {name: min(times) for name, times in per_step.items()},
        "ratio": paired_ratio("prepared"),
        "ratio_of_best": min(per_step["prepared"]) / min(per_step["hand_written"]),
        "control_ratio": paired_ratio("control"),
        "control_ratio_of_best": min(per_step["control"]) / min(per_step["hand_written"]),
        # CPU seconds this process spent per step: what the loop costs, without the time other programs took.
        "cpu_ratio": paired_ratio("prepared", cpu_per_step),
        "control_cpu_ratio": paired_ratio("control", cpu_per_step),
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
    step, best = result["step_s"], result["best_step_s"]
    print(f"processes: {args.nproc}  model: {args.depth}x{args.width} MLP  batch/process: {args.batch}  rounds: {args.rounds}")
    print(f"{'loop':<24}{'median ms/step':>16}{'best ms/step':>14}")
    for name, label in (("hand_written", "hand-written DDP"), ("prepared", "trainjob.torch"), ("control", "hand-written again")):
        print(f"{label:<24}{step[name] * 1e3:>16.2f}{best[name] * 1e3:>14.2f}")
    print(f"ratio trainjob.torch / hand-written: {result['ratio']:.3f} (paired median), {result['ratio_of_best']:.3f} (best)")
    print(f"noise floor, hand-written / itself:  {result['control_ratio']:.3f} (paired median), "
          f"{result['control_ratio_of_best']:.3f} (best); target ratio <= 1.02")
    print(f"CPU time per step, trainjob.torch / hand-written: {result['cpu_ratio']:.3f} "
          f"(noise floor {result['control_cpu_ratio']:.3f})")
    print(json.dumps({"benchmark": "overhead", "nproc": args.nproc, **kwargs, **result}))

if __name__ == "__main__":
    main()
