"""Bytes sent per step and step time of DDP with each communication hook, against no hook, in one run.

Every variant (no hook, ``fp16``, ``bf16``, ``powersgd``, ``topk``) is its own DDP copy of the same model in the
same processes, trained on the same batches in rotating rounds so machine noise hits each alike; figures are the
median of the per-round ratios against the no-hook run of that round.

Bytes are *measured*: the bytes this process handed to its sockets during the timed steps (``wchar`` in
``/proc/self/io``; gloo sends with ``writev``), so they include everything gloo puts on the wire for the step and
nothing other programs send. Next to them, the bytes the collectives' payloads predict (ring algorithms, see
:mod:`trainjob.torch.comm_hooks`). On CPU the compute of compression (casts, top-k selection, PowerSGD's
matrix products and orthogonalisation) runs on the same cores as the step, so fewer bytes need not mean a faster
step; over a slow network the byte ratio is what matters::

    python benchmarks/comm_hooks.py --nproc 2 --width 1024 --depth 4 --rounds 8
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

import trainjob.torch as tt

VARIANTS: dict[str, tuple[str | None, dict[str, Any] | None]] = {
    "none": (None, None),
    "fp16": ("fp16", None),
    "bf16": ("bf16", None),
    "powersgd": ("powersgd", {"rank": 1, "start_iter": 10}),
    "topk": ("topk", {"ratio": 0.01}),
}
WARMUP_STEPS = 12  # past DDP's bucket rebuild and PowerSGD's start_iter, so every hook runs compressed


def _model(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _bytes_written() -> int:
    """Bytes this process has written (files, pipes, sockets) since it started."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))


def _expected_bytes(name: str, options: dict[str, Any] | None, bucket_numels: list[int], world: int) -> float | None:
    """Payload bytes one rank sends per step by the ring formulas (None where it depends on the matrices' shapes)."""
    dense = sum(bucket_numels)
    if name == "none":
        return 2 * (world - 1) / world * 4 * dense
    if name in ("fp16", "bf16"):
        return 2 * (world - 1) / world * 2 * dense
    if name == "topk":
        ratio = (options or {}).get("ratio", 0.01)
        return sum((world - 1) * 8 * max(1, int(n * ratio)) for n in bucket_numels)
    return None


def measure(width: int, depth: int, batch: int, steps: int, rounds: int) -> dict[str, Any]:
    """Per-rank entry point: per-variant step time and bytes sent per step, and their ratios to no hook."""
    ctx = tt.init()
    gen = torch.Generator().manual_seed(1 + ctx.rank)
    x, y = torch.randn(batch, width, generator=gen), torch.randint(0, 10, (batch,), generator=gen)
    models = {
        name: tt.prepare_model(_model(width, depth), "ddp", comm_hook=hook, comm_hook_options=options)
        for name, (hook, options) in VARIANTS.items()
    }
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for name, m in models.items()}

    def run(name: str, n: int) -> None:
        for _ in range(n):
            F.cross_entropy(models[name](x), y).backward()
            optimizers[name].step()
            optimizers[name].zero_grad()

    for name in models:
        run(name, WARMUP_STEPS)
    # What a barrier pair alone writes, to take out of each measurement.
    before = _bytes_written()
    for _ in range(10):
        dist.barrier()
    barrier_bytes = (_bytes_written() - before) / 10
    names = list(models)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    sent: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            dist.barrier()
            start, cpu_start, bytes_start = time.perf_counter(), time.process_time(), _bytes_written()
            run(name, steps)
            dist.barrier()
            seconds[name].append((time.perf_counter() - start) / steps)
            cpu[name].append((time.process_time() - cpu_start) / steps)
            sent[name].append((_bytes_written() - bytes_start - barrier_bytes) / steps)

    def paired(series: dict[str, list[float]], name: str) -> float:
        return statistics.median(a / b for a, b in zip(series[name], series["none"], strict=True))

    numel = sum(p.numel() for p in models["none"].parameters())
    # DDP's buckets (25 MB) hold several parameters; the top-k count is per bucket, so ask DDP for its layout.
    bucket_numels = _bucket_numels(models["none"]) or [numel]
    return {
        "world_size": ctx.world_size,
        "parameters": numel,
        "buckets": len(bucket_numels),
        "rows": {
            name: {
                "step_ms": statistics.median(seconds[name]) * 1e3,
                "cpu_ms": statistics.median(cpu[name]) * 1e3,
                "bytes_sent": statistics.median(sent[name]),
                "expected_bytes": _expected_bytes(name, VARIANTS[name][1], bucket_numels, ctx.world_size),
                "time_ratio": paired(seconds, name),
                "cpu_ratio": paired(cpu, name),
                "bytes_ratio": paired(sent, name),
            }
            for name in names
        },
    }


def _bucket_numels(model: nn.Module) -> list[int] | None:
    """Elements per DDP bucket, from DDP's logging data (None if this torch does not report them)."""
    try:
        data = model._get_ddp_logging_data()  # type: ignore[operator]
        sizes = [int(s) for s in str(data.get("bucket_sizes", "")).split(",") if s.strip()]
    except Exception:  # noqa: BLE001 - an internal API: fall back to one bucket
        return None
    return [size // 4 for size in sizes] or None  # bytes of float32 gradients


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="per process")
    parser.add_argument("--steps", type=int, default=5, help="steps per variant per round")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()

    from trainjob.torch.testing import run_distributed

    sys.path.insert(0, str(Path(__file__).parent))  # spawned ranks import this file as the module "comm_hooks"
    kwargs = {k: getattr(args, k) for k in ("width", "depth", "batch", "steps", "rounds")}
    result = run_distributed("comm_hooks:measure", nproc=args.nproc, kwargs=kwargs, timeout=900)[0]
    print(
        f"processes: {args.nproc} (gloo, CPU)  model: {args.depth}x{args.width} MLP, {result['parameters'] / 1e6:.2f}M "
        f"parameters in {result['buckets']} DDP buckets  batch/process: {args.batch}  rounds: {args.rounds} x "
        f"{args.steps} steps"
    )
    header = (
        f"{'hook':<10}{'sent/step':>12}{'x none':>9}{'expected':>12}{'ms/step':>10}{'x none':>9}{'CPU ms':>9}"
        f"{'x none':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, row in result["rows"].items():
        expected = f"{row['expected_bytes'] / 1e6:.3f} MB" if row["expected_bytes"] is not None else "-"
        print(
            f"{name:<10}{row['bytes_sent'] / 1e6:>9.3f} MB{row['bytes_ratio']:>9.3f}{expected:>12}"
            f"{row['step_ms']:>10.2f}{row['time_ratio']:>9.3f}{row['cpu_ms']:>9.2f}{row['cpu_ratio']:>9.3f}"
        )
    print("sent/step: bytes this rank wrote to its sockets per step (measured); expected: the payload by the ring "
          "formulas; CPU ms: this process's CPU time per step (what compression costs, whatever else the machine "
          "runs); x none: median of per-round ratios to no hook in the same run")  # fmt: skip
    print(json.dumps({"benchmark": "comm_hooks", "nproc": args.nproc, **kwargs, **result}))


if __name__ == "__main__":
    main()
