"""Collective benchmarks: a real 2-process gloo run, and the pieces that make its numbers."""

from __future__ import annotations

import json

import click
import pytest
import torch
from click.testing import CliRunner

from trainjob.cli import tools
from trainjob.errors import ValidationError
from trainjob.tools.collectives import (
    BenchRow,
    _element_count,
    _expected,
    format_table,
    run_collectives,
    sweep_sizes,
)
from trainjob.tools.comm import COLLECTIVES


@pytest.fixture(scope="module")
def gloo_rows(distributed) -> list[BenchRow]:  # starts ranks itself, through the CLI
    # One launch, through the CLI, for every collective keeps the suite fast: two sizes each, a few iterations.
    group = click.Group("trainjob")
    tools.register(group)
    ops = [arg for op in COLLECTIVES for arg in ("--op", op)]
    args = [
        "bench",
        "collectives",
        *ops,
        "--nproc",
        "2",
        "-b",
        "1K",
        "-e",
        "4K",
        "-f",
        "4",
        "-n",
        "3",
        "-w",
        "1",
    ]
    result = CliRunner().invoke(group, [*args, "-o", "json"])
    assert result.exit_code == 0, result.output
    return [BenchRow(**row) for row in json.loads(result.stdout)]


def test_two_process_gloo_run_reports_every_op_and_size_correctly(gloo_rows: list[BenchRow]) -> None:
    assert [(r.op, r.size) for r in gloo_rows] == [(op, size) for op in COLLECTIVES for size in (1024, 4096)]
    for row in gloo_rows:
        assert row.wrong == 0, row
        assert row.time_us > 0 and row.algbw > 0 and row.busbw > 0, row
        assert row.count * 4 == row.size and row.type == "float"


def test_bus_bandwidth_uses_the_nccl_tests_factor_for_two_ranks(gloo_rows: list[BenchRow]) -> None:
    factors = {row.op: row.busbw / row.algbw for row in gloo_rows}
    assert factors == pytest.approx(
        {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5, "broadcast": 1.0}
    )
    for row in gloo_rows:
        assert row.algbw == pytest.approx(row.size / (row.time_us * 1e-6) / 1e9)


@pytest.mark.parametrize(
    ("op", "rank", "expected"),
    [
        # rank r sends (r + 1) + (i % 13): rank 0 [1, 2, 3, 4], rank 1 [2, 3, 4, 5]
        ("all_reduce", 1, [3, 5, 7, 9]),
        ("all_gather", 0, [1, 2, 2, 3]),
        ("reduce_scatter", 1, [7, 9]),
        ("all_to_all", 1, [3, 4, 4, 5]),
        ("broadcast", 1, [1, 2, 3, 4]),
    ],
)
def test_expected_results_for_two_ranks(op: str, rank: int, expected: list[int]) -> None:
    result = _expected(torch, op, rank, 2, 4, torch.float32, torch.device("cpu"))
    assert result.tolist() == expected


@pytest.mark.parametrize(
    ("op", "size", "ranks", "count"),
    [
        ("all_reduce", 1000, 3, 250),
        ("all_gather", 1000, 3, 249),
        ("all_to_all", 8, 4, 4),
        ("broadcast", 2, 2, 1),
    ],
)
def test_element_count_keeps_whole_chunks(op: str, size: int, ranks: int, count: int) -> None:
    assert _element_count(op, size, 4, ranks) == count


def test_sweep_sizes() -> None:
    assert sweep_sizes(1024, 16 << 20, 4) == [1024 * 4**k for k in range(8)]
    with pytest.raises(ValidationError, match="max_bytes: must be >= --min-bytes"):
        sweep_sizes(1024, 8, 2)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="needs a machine with fewer than 2 GPUs")
def test_nccl_without_enough_gpus_is_bad_input() -> None:
    with pytest.raises(ValidationError, match="backend: nccl needs one GPU per rank: 2 ranks"):
        run_collectives(["all_reduce"], nproc=2, backend="nccl")


def test_bad_arguments_are_reported_together_before_starting_processes() -> None:
    with pytest.raises(ValidationError) as caught:
        run_collectives(["allreduce"], nproc=2, backend="mpi")
    assert [e.path for e in caught.value.errors] == ["op", "backend"]


def test_table_has_the_nccl_tests_columns_and_a_verdict() -> None:
    rows = [
        BenchRow("all_reduce", 1024, 256, "float", "sum", -1, 50.0, 0.02048, 0.02048, 0),
        BenchRow("broadcast", 1024, 256, "float", "none", 0, 40.0, 0.0256, 0.0256, 3),
    ]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["#", "collective", "size", "count", "type", "redop", "root", "time(us)",
                                "algbw(GB/s)", "busbw(GB/s)", "#wrong"]  # fmt: skip
    assert lines[1].split() == [
        "all_reduce",
        "1024",
        "256",
        "float",
        "sum",
        "-1",
        "50.00",
        "0.02",
        "0.02",
        "0",
    ]
    assert lines[-1] == "# Wrong values         : 3 FAILED"
