"""The alpha-beta cost model of collectives, and nccl-tests' bus-bandwidth factors.

A message of ``m`` bytes over a link costs ``alpha + m / bandwidth``. For ``n`` ranks:

=====================  =========================================  ==========================================
collective             bytes each rank sends                      time
=====================  =========================================  ==========================================
ring all-reduce        ``2(n-1)/n · m``                           ``2(n-1) · (alpha + m/n / bw)``
tree all-reduce        ``2(n-1)/n · m`` on average                 ``2·log2(n) · (alpha + m / bw)``
ring all-gather        ``(n-1)/n · m`` (``m`` = gathered size)     ``(n-1) · (alpha + m/n / bw)``
ring reduce-scatter    ``(n-1)/n · m`` (``m`` = input size)        ``(n-1) · (alpha + m/n / bw)``
point-to-point         ``m``                                      ``alpha + m / bw``
=====================  =========================================  ==========================================

The all-reduce rows are the ring and tree formulas of the Megatron seed (``CalculateRingAllReduceTime``,
``CalculateTreeAllReduceTime``) without their reduction-compute term. Ring wins for large messages, tree for small
ones on many ranks:

>>> link = Link(bandwidth=25e9, latency=10e-6)
>>> round(ring_all_reduce_time(64, 1e9, link), 4), round(tree_all_reduce_time(64, 1e9, link), 4)
(0.08, 0.4801)
>>> ring_all_reduce_time(64, 1024, link) > tree_all_reduce_time(64, 1024, link)
True

nccl-tests reports *bus bandwidth* = algorithm bandwidth (size / time) × a factor per collective, so that numbers
are comparable with the link's peak whatever the rank count: ``bus_bandwidth_factor("all_reduce", 8) == 1.75``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from trainjob.errors import ValidationError

__all__ = [
    "BUS_BANDWIDTH_FACTORS",
    "COLLECTIVES",
    "Link",
    "all_gather_time",
    "bus_bandwidth_factor",
    "point_to_point_time",
    "reduce_scatter_time",
    "ring_all_reduce_time",
    "tree_all_reduce_time",
]


@dataclass(frozen=True)
class Link:
    """A link every rank of a group talks over: ``bandwidth`` in bytes/s per rank, ``latency`` in seconds."""

    bandwidth: float
    latency: float = 0.0


#: nccl-tests' factors (``busbw = algbw × factor``) for ``n`` ranks.
BUS_BANDWIDTH_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
COLLECTIVES = tuple(BUS_BANDWIDTH_FACTORS)


def bus_bandwidth_factor(op: str, ranks: int) -> float:
    """``busbw / algbw`` for ``op`` on ``ranks`` ranks: ``bus_bandwidth_factor("all_gather", 4) == 0.75``."""
    if op not in BUS_BANDWIDTH_FACTORS:
        raise ValidationError("op", f"must be one of {', '.join(COLLECTIVES)}, got {op!r}")
    if ranks < 1:
        raise ValidationError("nproc", f"must be >= 1, got {ranks}")
    return BUS_BANDWIDTH_FACTORS[op](ranks)


def ring_all_reduce_time(ranks: int, size: float, link: Link) -> float:
    """Seconds for a ring all-reduce of ``size`` bytes: reduce-scatter then all-gather, ``n-1`` steps each."""
    if ranks == 1:
        return 0.0
    return 2 * (ranks - 1) * (link.latency + size / ranks / link.bandwidth)


def tree_all_reduce_time(ranks: int, size: float, link: Link) -> float:
    """Seconds for a tree all-reduce: ``log2(n)`` steps up (reduce) and down (broadcast) with the whole message."""
    if ranks == 1:
        return 0.0
    return 2 * math.log2(ranks) * (link.latency + size / link.bandwidth)


def all_gather_time(ranks: int, size: float, link: Link) -> float:
    """Seconds for a ring all-gather whose gathered output is ``size`` bytes."""
    if ranks == 1:
        return 0.0
    return (ranks - 1) * (link.latency + size / ranks / link.bandwidth)


#: A ring reduce-scatter moves the same bytes in the same steps as a ring all-gather.
reduce_scatter_time = all_gather_time


def point_to_point_time(size: float, link: Link) -> float:
    """Seconds to send ``size`` bytes to one peer."""
    return link.latency + size / link.bandwidth
