"""Collective bandwidth on this machine, nccl-tests style, against the memory-copy bandwidth of the same run.

    python benchmarks/collectives.py                         # every collective, 2 ranks, gloo, 1 KiB .. 1 MiB
    python benchmarks/collectives.py --nproc 4 --max-bytes 16M --json results.json
    python benchmarks/collectives.py --backend nccl --nproc 8 --max-bytes 1G   # on a GPU node

The baseline is one process copying a buffer of the same size (``torch.Tensor.copy_``), measured in this run: a
collective between processes on one host cannot move bytes faster than memory does, so ``busbw / memcpy`` says
how much of the machine's copy bandwidth the backend reaches.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from trainjob.errors import ValidationError
from trainjob.tools.collectives import format_table, run_collectives
from trainjob.tools.comm import COLLECTIVES
from trainjob.units import parse_bytes


def memcpy_bandwidth(size: int, iters: int, device: str) -> float:
    """GB/s of copying ``size`` bytes within one device, best of ``iters`` timed blocks."""
    source = torch.ones(max(size // 4, 1), device=device)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(iters):
        start = time.perf_counter()
        for _ in range(10):
            target.copy_(source)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / 10)
    return source.numel() * 4 / best / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", action="append", choices=COLLECTIVES, help="repeatable; default: all")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--min-bytes", default="1K")
    parser.add_argument("--max-bytes", default="1M")
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--json", type=Path, help="also write the rows and baselines here")
    args = parser.parse_args(argv)
    try:
        rows = run_collectives(
            args.op or list(COLLECTIVES), args.nproc, parse_bytes(args.min_bytes, field="min_bytes"),
            parse_bytes(args.max_bytes, field="max_bytes"), args.factor, args.iters, args.warmup, "float", args.backend,
        )  # fmt: skip
    except ValidationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device = "cuda" if args.backend == "nccl" else "cpu"
    baseline = {size: memcpy_bandwidth(size, 5, device) for size in sorted({r.size for r in rows})}
    print(f"# {args.backend}, {args.nproc} ranks, {args.iters} iterations; torch {torch.__version__}")
    print(format_table(rows))
    print("#\n#   collective        size   busbw(GB/s)  memcpy(GB/s)  busbw/memcpy")
    for row in rows:
        ratio = row.busbw / baseline[row.size]
        print(f"{row.op:>14}{row.size:>12}{row.busbw:>14.3f}{baseline[row.size]:>14.3f}{ratio:>14.4f}")
    if args.json:
        report = {"rows": [r.to_dict() for r in rows], "memcpy_gbps": baseline, "nproc": args.nproc}
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if any(r.wrong for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
