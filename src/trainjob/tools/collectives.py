"""Collective benchmarks in the style of nccl-tests: time, algorithm and bus bandwidth, and a correctness check.

>>> rows = run_collectives(["all_reduce"], nproc=2, min_bytes=1024, max_bytes=1024)  # doctest: +SKIP
>>> print(format_table(rows))                                                         # doctest: +SKIP
#   collective        size       count    type  redop  root   time(us)  algbw(GB/s)  busbw(GB/s)  #wrong
    all_reduce        1024         256   float    sum    -1      41.20         0.02         0.02       0
# Avg bus bandwidth    : 0.0249 GB/s
# Wrong values         : 0 OK

Columns mean what they mean in nccl-tests: ``size`` is the bytes of the whole buffer (the gathered output of an
all-gather, the input of a reduce-scatter), ``time`` the average of ``iters`` back-to-back calls on the slowest
rank, ``algbw = size / time`` and ``busbw = algbw × factor`` (:data:`trainjob.tools.comm.BUS_BANDWIDTH_FACTORS`),
which is comparable with the link's peak. ``#wrong`` counts elements, over all ranks, that differ from the
expected result after one out-of-place call on data that sums exactly. torch's ``all_reduce`` and ``broadcast``
work in place, so their out-of-place form (the one timed) copies the input into the output buffer first; on GPUs
that copy is tiny next to the collective, on CPU with small buffers it is part of what is measured.

Each rank runs :func:`benchmark_rank` in a process started by :func:`trainjob.torch.testing.run_distributed`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from trainjob.errors import ValidationError
from trainjob.tools.comm import COLLECTIVES, bus_bandwidth_factor

__all__ = [
    "BACKENDS",
    "DTYPES",
    "BenchRow",
    "benchmark_rank",
    "format_table",
    "run_collectives",
    "sweep_sizes",
]

BACKENDS = ("gloo", "nccl")
#: nccl-tests' type names and the torch dtypes they stand for.
DTYPES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "bfloat16": "bfloat16",
    "int32": "int32",
}
_PERIOD = 13  # input values are (rank + 1) + (index % 13): small integers, so every sum is exact


@dataclass(frozen=True)
class BenchRow:
    """One line of the table."""

    op: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """``min_bytes``, ``min_bytes × factor``, ... up to ``max_bytes``: ``sweep_sizes(1024, 8192, 2)``."""
    if min_bytes < 1:
        raise ValidationError("min_bytes", f"must be >= 1, got {min_bytes}")
    if max_bytes < min_bytes:
        raise ValidationError("max_bytes", f"must be >= --min-bytes ({min_bytes}), got {max_bytes}")
    if factor < 2:
        raise ValidationError("factor", f"must be an integer >= 2, got {factor}")
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes:
        sizes.append(sizes[-1] * factor)
    return sizes


def _element_count(op: str, size: int, element_size: int, ranks: int) -> int:
    # Like nccl-tests, shrink a size to whole elements and, where the buffer is split over ranks, whole chunks.
    per = element_size * (ranks if op in ("all_gather", "reduce_scatter", "all_to_all") else 1)
    return max(size // per, 1) * per // element_size


def _pattern(torch: Any, rank: int, count: int, offset: int, dtype: Any, device: Any) -> Any:
    index = torch.arange(offset, offset + count, device=device)
    return ((index % _PERIOD) + rank + 1).to(dtype)


def _operation(op: str, dist: Any, rank: int) -> tuple[Callable[[Any, Any], Any], str, int]:
    """``call(input, output)`` running ``op`` out of place, its reduction name and its root (-1: none)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def all_reduce(inp: Any, out: Any) -> None:
        out.copy_(inp)  # torch's all_reduce is in place; the copy keeps the input intact
        dist.all_reduce(out)

    def broadcast(inp: Any, out: Any) -> None:
        if rank == 0:
            out.copy_(inp)
        dist.broadcast(out, src=0)

    calls: dict[str, tuple[Callable[[Any, Any], Any], str, int]] = {
        "all_reduce": (all_reduce, "sum", -1),
        "all_gather": (lambda inp, out: gather(out, inp), "none", -1),
        "reduce_scatter": (lambda inp, out: scatter(out, inp), "sum", -1),
        "all_to_all": (lambda inp, out: dist.all_to_all_single(out, inp), "none", -1),
        "broadcast": (broadcast, "none", 0),
    }
    return calls[op]


def _expected(torch: Any, op: str, rank: int, ranks: int, count: int, dtype: Any, device: Any) -> Any:
    chunk = count // ranks
    if op == "all_reduce":
        return sum(_pattern(torch, r, count, 0, torch.float64, device) for r in range(ranks)).to(dtype)
    if op == "all_gather":
        return torch.cat([_pattern(torch, r, chunk, 0, dtype, device) for r in range(ranks)])
    if op == "reduce_scatter":
        return sum(_pattern(torch, r, chunk, rank * chunk, torch.float64, device) for r in range(ranks)).to(
            dtype
        )
    if op == "all_to_all":
        return torch.cat([_pattern(torch, r, chunk, rank * chunk, dtype, device) for r in range(ranks)])
    return _pattern(torch, 0, count, 0, dtype, device)  # broadcast from rank 0


def _one_size(op: str, size: int, iters: int, warmup: int, type_name: str, device: Any) -> BenchRow:
    import torch
    import torch.distributed as dist

    rank, ranks = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, DTYPES[type_name])
    count = _element_count(op, size, torch.empty((), dtype=dtype).element_size(), ranks)
    in_count = count // ranks if op == "all_gather" else count
    out_count = count // ranks if op == "reduce_scatter" else count
    call, redop, root = _operation(op, dist, rank)
    inp = _pattern(torch, rank, in_count, 0, dtype, device)
    out = torch.zeros(out_count, dtype=dtype, device=device)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        call(inp, out)
    synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call(inp, out)
    synchronize()
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # a collective is done when its slowest rank is

    out.fill_(-1)
    call(inp, out)
    synchronize()
    expected = _expected(torch, op, rank, ranks, count, dtype, device)
    wrong = torch.tensor([int((out != expected).sum())], dtype=torch.int64, device=device)
    dist.all_reduce(wrong)

    seconds = float(elapsed)
    nbytes = count * inp.element_size()
    algbw = nbytes / seconds / 1e9
    return BenchRow(op, nbytes, count, type_name, redop, root, seconds * 1e6, algbw,
                    algbw * bus_bandwidth_factor(op, ranks), int(wrong))  # fmt: skip


def benchmark_rank(
    ops: list[str], sizes: list[int], iters: int, warmup: int, type_name: str, backend: str
) -> list[dict[str, Any]]:
    """Run in every rank: each op over each size. Returns the rows (identical on every rank)."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        local_rank = int(os.environ["LOCAL_RANK"])
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
    return [_one_size(op, size, iters, warmup, type_name, device).to_dict() for op in ops for size in sizes]


def _validate(ops: list[str], nproc: int, iters: int, warmup: int, type_name: str, backend: str) -> None:
    problems = []
    for op in ops:
        if op not in COLLECTIVES:
            problems.append(ValidationError("op", f"must be one of {', '.join(COLLECTIVES)}, got {op!r}"))
    if nproc < 1:
        problems.append(ValidationError("nproc", f"must be >= 1, got {nproc}"))
    if iters < 1:
        problems.append(ValidationError("iters", f"must be >= 1, got {iters}"))
    if warmup < 0:
        problems.append(ValidationError("warmup", f"must be >= 0, got {warmup}"))
    if type_name not in DTYPES:
        problems.append(ValidationError("dtype", f"must be one of {', '.join(DTYPES)}, got {type_name!r}"))
    if backend not in BACKENDS:
        problems.append(ValidationError("backend", f"must be one of {', '.join(BACKENDS)}, got {backend!r}"))
    if backend == "nccl" and not problems:
        import torch

        if torch.cuda.device_count() < nproc:
            gpus = torch.cuda.device_count()
            problems.append(
                ValidationError(
                    "backend", f"nccl needs one GPU per rank: {nproc} ranks, {gpus} GPUs visible; use gloo"
                )
            )
    if problems:
        raise ValidationError.combine(problems)


def run_collectives(
    ops: list[str],
    nproc: int = 2,
    min_bytes: int = 1024,
    max_bytes: int = 1 << 20,
    factor: int = 2,
    iters: int = 20,
    warmup: int = 5,
    type_name: str = "float",
    backend: str = "gloo",
    timeout: float = 300.0,
) -> list[BenchRow]:
    """Start ``nproc`` processes, benchmark ``ops`` from ``min_bytes`` to ``max_bytes``, return the rows.

    ``run_collectives(["all_reduce", "all_gather"], nproc=2, max_bytes=64 << 10)``. Bad arguments raise
    :class:`~trainjob.errors.ValidationError` naming the argument; a failing rank raises
    :class:`~trainjob.torch.testing.DistributedRunError` with its traceback.
    """
    from trainjob.torch.testing import run_distributed

    _validate(ops, nproc, iters, warmup, type_name, backend)
    sizes = sweep_sizes(min_bytes, max_bytes, factor)
    kwargs = {
        "ops": ops,
        "sizes": sizes,
        "iters": iters,
        "warmup": warmup,
        "type_name": type_name,
        "backend": backend,
    }
    results = run_distributed(
        "trainjob.tools.collectives:benchmark_rank",
        nproc,
        kwargs,
        timeout=timeout,
        init_process_group=backend == "gloo",
    )
    return [BenchRow(**row) for row in results[0]]


_COLUMNS = (("collective", 14, "op"), ("size", 12, "size"), ("count", 12, "count"), ("type", 8, "type"),
            ("redop", 7, "redop"), ("root", 6, "root"), ("time(us)", 11, "time_us"),
            ("algbw(GB/s)", 13, "algbw"), ("busbw(GB/s)", 13, "busbw"), ("#wrong", 8, "wrong"))  # fmt: skip


def format_table(rows: list[BenchRow]) -> str:
    """Right-aligned columns under a ``#`` header, then the average bus bandwidth, as nccl-tests prints them."""
    header = "#" + "".join(f"{title:>{width}}" for title, width, _ in _COLUMNS)[1:]
    lines = [header]
    for row in rows:
        cells = []
        for _, width, key in _COLUMNS:
            value = getattr(row, key)
            text = f"{value:.2f}" if isinstance(value, float) else str(value)
            cells.append(f"{text:>{width}}")
        lines.append("".join(cells))
    if rows:
        lines.append(f"# Avg bus bandwidth    : {sum(r.busbw for r in rows) / len(rows):.4f} GB/s")
        lines.append(
            f"# Wrong values         : {sum(r.wrong for r in rows)} {'OK' if not any(r.wrong for r in rows) else 'FAILED'}"
        )
    return "\n".join(lines)
