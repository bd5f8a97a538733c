"""Collective cost model and nccl-tests' bus-bandwidth factors."""

from __future__ import annotations

import pytest

from trainjob.errors import ValidationError
from trainjob.tools.comm import (
    Link,
    all_gather_time,
    bus_bandwidth_factor,
    ring_all_reduce_time,
    tree_all_reduce_time,
)


@pytest.mark.parametrize(
    ("op", "ranks", "factor"),
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 8, 1.75),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 8, 0.875),
        ("all_to_all", 2, 0.5),
        ("broadcast", 16, 1.0),
        ("all_reduce", 1, 0.0),
    ],
)
def test_bus_bandwidth_factor(op: str, ranks: int, factor: float) -> None:
    assert bus_bandwidth_factor(op, ranks) == pytest.approx(factor)


def test_bus_bandwidth_reproduces_the_seed_nccl_tests_output() -> None:
    # Seed 003: all_reduce_perf -g 8 prints "8388608  100  1243.2  6.75  11.81".
    algbw = 8388608 / 1243.2e-6 / 1e9
    assert round(algbw, 2) == 6.75
    assert round(algbw * bus_bandwidth_factor("all_reduce", 8), 2) == 11.81


def test_unknown_collective_names_the_accepted_ones() -> None:
    with pytest.raises(ValidationError, match="op: must be one of all_reduce, all_gather"):
        bus_bandwidth_factor("scatter", 2)


LINK = Link(bandwidth=10e9, latency=5e-6)


@pytest.mark.parametrize(
    ("ranks", "size", "ring", "tree"),
    [
        # Seed 002: ring = 2(n-1)(a + m/n·b), tree = 2·log2(n)(a + m·b)
        (4, 1e9, 2 * 3 * (5e-6 + 0.25e9 / 10e9), 2 * 2 * (5e-6 + 1e9 / 10e9)),
        (8, 8.0, 2 * 7 * (5e-6 + 1 / 10e9), 2 * 3 * (5e-6 + 8 / 10e9)),
        (1, 1e9, 0.0, 0.0),
    ],
)
def test_all_reduce_times_follow_the_seed_formulas(ranks: int, size: float, ring: float, tree: float) -> None:
    assert ring_all_reduce_time(ranks, size, LINK) == pytest.approx(ring)
    assert tree_all_reduce_time(ranks, size, LINK) == pytest.approx(tree)


def test_ring_wins_for_big_messages_and_tree_for_small_ones() -> None:
    assert ring_all_reduce_time(64, 1e9, LINK) < tree_all_reduce_time(64, 1e9, LINK)
    assert tree_all_reduce_time(64, 1e3, LINK) < ring_all_reduce_time(64, 1e3, LINK)


def test_all_gather_is_half_an_all_reduce() -> None:
    assert all_gather_time(8, 1e9, LINK) * 2 == pytest.approx(ring_all_reduce_time(8, 1e9, LINK))
