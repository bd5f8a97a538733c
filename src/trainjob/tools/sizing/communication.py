"""Per-step communication of a training run: each collective, its group, its bytes and its time.

>>> from trainjob.tools.sizing.communication import estimate_communication
>>> from trainjob.tools.training_setup import TrainingSetup
>>> setup = TrainingSetup(params=7.5e9, gpus=8, nodes=8, zero=1)
>>> [(c.name, c.group_size) for c in estimate_communication(setup).collectives]
[('grad reduce-scatter', 64), ('param all-gather', 64)]

Times come from the cost model of :mod:`trainjob.tools.comm` over :data:`DEFAULT_INTRA_NODE` and
:data:`DEFAULT_INTER_NODE` links unless others are given.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainjob.tools.comm import (
    Link,
    all_gather_time,
    point_to_point_time,
    reduce_scatter_time,
    ring_all_reduce_time,
    tree_all_reduce_time,
)
from trainjob.tools.sizing.memory import pipeline_bubble_fraction
from trainjob.tools.training_setup import TrainingSetup

#: NVLink-class GPU-to-GPU bandwidth inside a node (A100: 300 GB/s each way) and a typical small-message latency.
DEFAULT_INTRA_NODE = Link(bandwidth=300e9, latency=3e-6)
#: One 200 Gb/s InfiniBand NIC per GPU between nodes.
DEFAULT_INTER_NODE = Link(bandwidth=25e9, latency=10e-6)


@dataclass(frozen=True)
class Collective:
    """One kind of communication in a training step, as seen by one GPU."""

    name: str
    group: str  # "dp", "tp" or "pp"
    group_size: int
    message_bytes: float
    calls_per_step: int
    bytes_sent_per_step: float
    seconds_per_step: float
    inter_node: bool
    algorithm: str


@dataclass(frozen=True)
class CommunicationEstimate:
    """Per-step communication of one GPU, and the pipeline bubble."""

    setup: TrainingSetup
    collectives: list[Collective]
    bubble_fraction: float

    @property
    def bytes_sent_per_step(self) -> float:
        return sum(c.bytes_sent_per_step for c in self.collectives)

    @property
    def seconds_per_step(self) -> float:
        """Sum of the collectives' times, as if nothing overlapped with compute (an upper bound)."""
        return sum(c.seconds_per_step for c in self.collectives)


def _ring(name: str, group: str, n: int, size: float, calls: int, link: Link, inter: bool) -> Collective:
    one_call = all_gather_time(n, size, link) if "gather" in name else reduce_scatter_time(n, size, link)
    sent = (n - 1) / n * size * calls
    return Collective(name, group, n, size, calls, sent, one_call * calls, inter, "ring")


def _all_reduce(
    name: str, group: str, n: int, size: float, calls: int, link: Link, inter: bool
) -> Collective:
    ring, tree = ring_all_reduce_time(n, size, link), tree_all_reduce_time(n, size, link)
    sent = 2 * (n - 1) / n * size * calls  # the same on average for ring and tree (n-1 edges, m up, m down)
    algorithm, seconds = ("ring", ring) if ring <= tree else ("tree", tree)
    return Collective(name, group, n, size, calls, sent, seconds * calls, inter, algorithm)


def estimate_communication(
    setup: TrainingSetup,
    intra_node: Link = DEFAULT_INTRA_NODE,
    inter_node: Link = DEFAULT_INTER_NODE,
) -> CommunicationEstimate:
    """What one GPU sends per optimizer step and how long it takes, with ``micro_batches`` micro-batches.

    * data parallel, ZeRO 0: one gradient all-reduce per step (DDP accumulates locally, ``no_sync``);
    * ZeRO 1: gradient reduce-scatter + parameter all-gather per step, the same ``2Ψ`` bytes as DDP;
    * ZeRO 2: the gradient reduce-scatter runs every micro-batch (gradients are sharded), all-gather once;
    * ZeRO 3: parameters are all-gathered for forward and again for backward, gradients reduce-scattered, every
      micro-batch: ``3Ψ`` per micro-batch, 1.5× DDP;
    * tensor parallel: 2 all-reduces of ``s·b·h`` activations per layer forward, 2 backward, 2 more when the
      forward is recomputed (activation checkpointing);
    * pipeline parallel: one activation send forward and one gradient send backward per micro-batch.

    A group whose ranks sit on more than one node runs at ``inter_node`` speed, otherwise ``intra_node``.

    >>> plan = estimate_communication(TrainingSetup(params=7e9, gpus=8, nodes=2, zero=0))
    >>> c = plan.collectives[0]; (c.name, c.group_size, c.message_bytes / 1e9, c.inter_node)
    ('grad all-reduce', 16, 14.0, True)
    """
    psi, dp, m = setup.params_per_gpu, setup.dp, setup.micro_batches or 1
    grads = setup.value_bytes * psi
    collectives: list[Collective] = []

    def link(group: str) -> tuple[Link, bool]:
        inter = setup.group_spans_nodes(group)  # type: ignore[arg-type]
        return (inter_node if inter else intra_node), inter

    if dp > 1:
        dp_link, inter = link("dp")
        if setup.zero == 0:
            collectives.append(_all_reduce("grad all-reduce", "dp", dp, grads, 1, dp_link, inter))
        else:
            scatters = m if setup.zero >= 2 else 1
            collectives.append(_ring("grad reduce-scatter", "dp", dp, grads, scatters, dp_link, inter))
            gathers = 2 * m if setup.zero == 3 else 1
            collectives.append(_ring("param all-gather", "dp", dp, grads, gathers, dp_link, inter))
    if setup.has_shape:
        assert setup.seq is not None and setup.hidden is not None and setup.layers is not None
        activation = setup.seq * setup.micro_batch * setup.hidden * setup.value_bytes
        if setup.tp > 1:
            tp_link, inter = link("tp")
            per_layer = 6 if setup.activation_checkpointing else 4
            calls = setup.layers // setup.pp * per_layer * m
            collectives.append(
                _all_reduce("TP all-reduce", "tp", setup.tp, activation, calls, tp_link, inter)
            )
        if setup.pp > 1:
            pp_link, inter = link("pp")
            sends = 2 * m * setup.stages_per_rank  # forward activation and backward gradient, per stage held
            seconds = sends * point_to_point_time(activation, pp_link)
            collectives.append(
                Collective(
                    "PP send/recv", "pp", 2, activation, sends, sends * activation, seconds, inter, "p2p"
                )
            )
    return CommunicationEstimate(setup, collectives, pipeline_bubble_fraction(setup.pp, m, setup.stages_per_rank))
