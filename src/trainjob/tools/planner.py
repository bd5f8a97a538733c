"""Per-GPU memory and per-step communication of a training run, from the formulas the seeds teach.

>>> from trainjob.tools.planner import TrainingSetup, plan_memory, plan_communication
>>> setup = TrainingSetup(params=7.5e9, gpus=8, nodes=8, zero=1)        # 64 GPUs, bf16, Adam
>>> round(plan_memory(setup).model_states / 1e9, 1)                      # 2Ψ + 2Ψ + 12Ψ/64
31.4
>>> [(c.name, c.group_size) for c in plan_communication(setup).collectives]
[('grad reduce-scatter', 64), ('param all-gather', 64)]

Model states per GPU, with ``Ψ`` parameters per model-parallel shard (``params / (tp·pp)``) and ``N`` the
data-parallel degree (mixed-precision Adam: 2 bytes of bf16/fp16 weights, 2 of gradients and ``K = 12`` of fp32
master weights, momentum and variance):

=======  ===================  ===================  ====================
ZeRO     parameters           gradients            optimizer states
=======  ===================  ===================  ====================
0 (DDP)  ``2Ψ``               ``2Ψ``               ``KΨ``
1        ``2Ψ``               ``2Ψ``               ``KΨ / N``
2        ``2Ψ``               ``2Ψ / N``           ``KΨ / N``
3        ``2Ψ / N``           ``2Ψ / N``           ``KΨ / N``
=======  ===================  ===================  ====================

``K`` is 12 for Adam/AdamW in bf16/fp16, 8 in fp32 (no master copy); 8 and 4 for SGD with momentum. ``offload``
moves the optimizer states to host memory.

Activations per layer and micro-batch (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", 16-bit values, tensor parallelism without sequence parallelism): ``s·b·h·(10 + 24/t + 5·a·s/(h·t))``
bytes, where the ``5·a·s/(h·t)`` term is the attention score matrices that fused attention kernels
(FlashAttention, ``flash_attention=True``) never store; with full activation checkpointing only each layer's input (``2·s·b·h``) is kept, plus one layer's
activations while it is recomputed. With a 1F1B pipeline the first stage holds ``min(pp, m)`` micro-batches of its
``layers/pp`` layers.
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
from trainjob.tools.setup import TrainingSetup

__all__ = [
    "DEFAULT_INTER_NODE",
    "DEFAULT_INTRA_NODE",
    "Collective",
    "CommunicationPlan",
    "MemoryPlan",
    "TrainingSetup",
    "optimizer_bytes_per_param",
    "pipeline_bubble_fraction",
    "plan_communication",
    "plan_memory",
]

#: NVLink-class GPU-to-GPU bandwidth inside a node (A100: 300 GB/s each way) and a typical small-message latency.
DEFAULT_INTRA_NODE = Link(bandwidth=300e9, latency=3e-6)
#: One 200 Gb/s InfiniBand NIC per GPU between nodes.
DEFAULT_INTER_NODE = Link(bandwidth=25e9, latency=10e-6)


def optimizer_bytes_per_param(optimizer: str, dtype: str) -> int:
    """``K``: optimizer-state bytes per parameter. ``optimizer_bytes_per_param("adam", "bf16") == 12``."""
    moments = 8 if optimizer in ("adam", "adamw") else 4  # Adam: momentum + variance; SGD: momentum
    master_copy = 0 if dtype == "fp32" else 4  # mixed precision keeps fp32 weights for the update
    return moments + master_copy


def pipeline_bubble_fraction(stages: int, micro_batches: int) -> float:
    """Idle share of a GPipe/1F1B step, ``(p-1)/(m+p-1)``: ``pipeline_bubble_fraction(4, 64) == 3/67``."""
    return (stages - 1) / (micro_batches + stages - 1)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU. ``activations`` is ``None`` when the model shape (layers, hidden, heads, seq) is unknown."""

    setup: TrainingSetup
    parameters: float
    gradients: float
    optimizer_states: float
    offloaded_to_host: float
    activations: float | None
    activations_checkpointed: float | None

    @property
    def model_states(self) -> float:
        """Parameters + gradients + optimizer states kept on the GPU."""
        return self.parameters + self.gradients + self.optimizer_states

    @property
    def total(self) -> float:
        """Model states plus the activations of the chosen mode (checkpointed or not)."""
        chosen = self.activations_checkpointed if self.setup.activation_checkpointing else self.activations
        return self.model_states + (chosen or 0.0)


def _activation_bytes(setup: TrainingSetup) -> tuple[float, float] | None:
    if not setup.has_shape:
        return None
    s, b, h, a, t = setup.seq, setup.micro_batch, setup.hidden, setup.heads, setup.tp
    assert s is not None and h is not None and a is not None and setup.layers is not None
    scale = setup.value_bytes / 2  # the formula counts 16-bit values
    attention_scores = 0 if setup.flash_attention else 5 * a * s / (h * t)
    per_layer = s * b * h * (10 + 24 / t + attention_scores) * scale
    layer_input = 2 * s * b * h * scale
    in_flight = min(setup.pp, setup.micro_batches or 1)
    held_layers = setup.layers // setup.pp * in_flight
    return held_layers * per_layer, held_layers * layer_input + per_layer


def plan_memory(setup: TrainingSetup) -> MemoryPlan:
    """Per-GPU memory of ``setup``.

    >>> plan = plan_memory(TrainingSetup(params=7.5e9, gpus=8, nodes=8, zero=3))
    >>> round(plan.model_states / 1e9, 3)                                  # 16Ψ / 64
    1.875
    """
    psi, n = setup.params_per_gpu, setup.dp
    weights = setup.value_bytes * psi
    optimizer = optimizer_bytes_per_param(setup.optimizer, setup.dtype) * psi / (n if setup.zero >= 1 else 1)
    activations = _activation_bytes(setup)
    return MemoryPlan(
        setup=setup,
        parameters=weights / n if setup.zero >= 3 else weights,
        gradients=weights / n if setup.zero >= 2 else weights,
        optimizer_states=0.0 if setup.offload else optimizer,
        offloaded_to_host=optimizer if setup.offload else 0.0,
        activations=activations[0] if activations else None,
        activations_checkpointed=activations[1] if activations else None,
    )


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
class CommunicationPlan:
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


def plan_communication(
    setup: TrainingSetup,
    intra_node: Link = DEFAULT_INTRA_NODE,
    inter_node: Link = DEFAULT_INTER_NODE,
) -> CommunicationPlan:
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

    >>> plan = plan_communication(TrainingSetup(params=7e9, gpus=8, nodes=2, zero=0))
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
            seconds = 2 * m * point_to_point_time(activation, pp_link)
            collectives.append(
                Collective(
                    "PP send/recv", "pp", 2, activation, 2 * m, 2 * m * activation, seconds, inter, "p2p"
                )
            )
    return CommunicationPlan(setup, collectives, pipeline_bubble_fraction(setup.pp, m))
