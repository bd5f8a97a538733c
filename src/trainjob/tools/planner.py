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
moves the optimizer states to host memory (DeepSpeed's ZeRO-Offload); ``cpu_offload`` is what the library's
``parallelize(..., cpu_offload=True)`` does (FSDP2): the shard's parameters and gradients (float32) and optimizer
moments all in host memory, ``(8 + moments)·Ψ/N`` bytes, the GPU holding only the blocks being computed.

With ZeRO-3 (and with ``cpu_offload``) FSDP gathers one transformer block's full parameters at a time and prefetches
the next, and a block's full gradients (float32) exist until they are reduce-scattered: ``gathered`` counts
``(2·2 + 4)·12h²/t`` bytes for that when the shape is known (on top of the paper's model states).

Activations per layer and micro-batch (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", 16-bit values, tensor parallelism without sequence parallelism): ``s·b·h·(10 + 24/t + 5·a·s/(h·t))``
bytes, where the ``5·a·s/(h·t)`` term is the attention score matrices that fused attention kernels
(FlashAttention, ``flash_attention=True``) never store; with full activation checkpointing only each layer's input (``2·s·b·h``) is kept, plus one layer's
activations while it is recomputed. With a 1F1B pipeline the first stage holds ``min(pp, m)`` micro-batches of its
``layers/pp`` layers; with GPipe all ``m``; interleaved 1F1B with ``v`` stages per rank ``(1 + (p-1)/(p·v))`` times
1F1B's (Narayanan et al. 2021).

Pipeline bubble (idle share of a step): ``(p-1)/(m+p-1)`` for GPipe and 1F1B, ``(p-1)/(v·m+p-1)`` interleaved.

:func:`plan_auto` (``trainjob plan --auto``) tries every layout the library can build (TP inside a node, PP, ZeRO
0/2/3 — this library's stage 1 is stage 2 —, FSDP CPU offload, activation checkpointing, micro-batch size, pipeline
schedule), keeps those that fit in 90 % of GPU memory (and, offloaded, in host memory), and ranks them by an estimated
step time: ``6·N + 12·L·h·s`` FLOPs per token (``8·N + 16·L·h·s`` recomputing) at ``compute_efficiency`` of peak,
plus the pipeline bubble, TP/PP communication, the data-parallel communication that backward (ZeRO-3: the whole step)
cannot hide, and for CPU offload the float32 shard's PCIe copies and the CPU Adam step. Data-parallel traffic is
counted as above, per micro-batch for ZeRO 2/3 (backward on each micro-batch; pipelined, PyTorch's schedule
reduces once, so PP layouts are estimated conservatively). Equal estimates go to fewer moving parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainjob.errors import ValidationError
from trainjob.tools.comm import (
    Link,
    all_gather_time,
    point_to_point_time,
    reduce_scatter_time,
    ring_all_reduce_time,
    tree_all_reduce_time,
)
from trainjob.tools.training_setup import TrainingSetup

if TYPE_CHECKING:
    from trainjob.torch.deepspeed_config import DeepSpeedConfig, DeepSpeedSettings

__all__ = [
    "DEFAULT_INTER_NODE",
    "DEFAULT_INTRA_NODE",
    "SEED_TABLE",
    "AutoPlan",
    "Candidate",
    "Collective",
    "CommunicationPlan",
    "Hardware",
    "MemoryPlan",
    "deepspeed_setup",
    "derived_shape",
    "plan_auto",
    "realisation",
    "seed_row",
    "trainjob_resources",
    "TrainingSetup",
    "block_parameters",
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


def pipeline_bubble_fraction(stages: int, micro_batches: int, stages_per_rank: int = 1) -> float:
    """Idle share of a pipelined step, ``(p-1)/(v·m+p-1)`` (``v = 1`` for GPipe/1F1B, 2 for interleaved 1F1B):
    ``pipeline_bubble_fraction(4, 64) == 3/67``."""
    return (stages - 1) / (stages_per_rank * micro_batches + stages - 1)


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
    gathered: float = 0.0

    @property
    def model_states(self) -> float:
        """Parameters + gradients + optimizer states kept on the GPU."""
        return self.parameters + self.gradients + self.optimizer_states

    @property
    def total(self) -> float:
        """Model states, gathered blocks and the activations of the chosen mode (checkpointed or not)."""
        chosen = self.activations_checkpointed if self.setup.activation_checkpointing else self.activations
        return self.model_states + self.gathered + (chosen or 0.0)


def _activation_bytes(setup: TrainingSetup) -> tuple[float, float] | None:
    if not setup.has_shape:
        return None
    s, b, h, a, t = setup.seq, setup.micro_batch, setup.hidden, setup.heads, setup.tp
    assert s is not None and h is not None and a is not None and setup.layers is not None
    scale = setup.value_bytes / 2  # the formula counts 16-bit values
    attention_scores = 0 if setup.flash_attention else 5 * a * s / (h * t)
    per_layer = s * b * h * (10 + 24 / t + attention_scores) * scale
    layer_input = 2 * s * b * h * scale
    m = setup.micro_batches or 1
    in_flight: float = m if setup.schedule == "GPipe" else min(setup.pp, m)
    v = setup.stages_per_rank
    if v > 1:
        in_flight *= 1 + (setup.pp - 1) / (setup.pp * v)
    held_layers = setup.layers / setup.pp * in_flight
    return held_layers * per_layer, held_layers * layer_input + per_layer


def block_parameters(setup: TrainingSetup) -> float | None:
    """Parameters of one transformer block on one tensor-parallel rank, ``12h²/t`` (None without ``hidden``)."""
    return None if setup.hidden is None else 12 * setup.hidden**2 / setup.tp


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
    block = block_parameters(setup)
    gathered = (2 * setup.value_bytes + 4) * block if block is not None and (setup.zero >= 3 or setup.cpu_offload) else 0.0
    if setup.cpu_offload:
        moments = 8 if setup.optimizer in ("adam", "adamw") else 4
        return MemoryPlan(
            setup=setup,
            parameters=0.0,
            gradients=0.0,
            optimizer_states=0.0,
            offloaded_to_host=(8 + moments) * psi / n,
            activations=activations[0] if activations else None,
            activations_checkpointed=activations[1] if activations else None,
            # ZeRO-2 keeps every block gathered through the step (reshard_after_forward=False).
            gathered=gathered if setup.zero >= 3 else weights + 4 * (block or 0),
        )
    return MemoryPlan(
        setup=setup,
        parameters=weights / n if setup.zero >= 3 else weights,
        gradients=weights / n if setup.zero >= 2 else weights,
        optimizer_states=0.0 if setup.offload else optimizer,
        offloaded_to_host=optimizer if setup.offload else 0.0,
        activations=activations[0] if activations else None,
        activations_checkpointed=activations[1] if activations else None,
        gathered=gathered,
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
            sends = 2 * m * setup.stages_per_rank  # forward activation and backward gradient, per stage held
            seconds = sends * point_to_point_time(activation, pp_link)
            collectives.append(
                Collective(
                    "PP send/recv", "pp", 2, activation, sends, sends * activation, seconds, inter, "p2p"
                )
            )
    return CommunicationPlan(setup, collectives, pipeline_bubble_fraction(setup.pp, m, setup.stages_per_rank))


# --------------------------------------------------------------------------------------------------------------------
# plan --auto: search the layouts that fit, rank them by estimated step time.


@dataclass(frozen=True)
class Hardware:
    """The machines: ``gpus`` per node, ``nodes``, each GPU's memory and dense peak FLOP/s, links, host side.

    ``compute_efficiency`` is the share of peak the matrix work reaches (model FLOPs utilisation without the
    communication and bubble the planner adds itself); ``memory_headroom`` the share of GPU memory kept free for the
    CUDA context, allocator fragmentation and temporary buffers. ``pcie`` is host-device bandwidth per GPU and
    ``cpu_adam_rate`` the parameters per second one node's CPUs update with Adam (both used for ``cpu_offload``).
    """

    gpus: int
    nodes: int
    gpu_memory: float
    gpu_flops: float = 312e12  # A100 dense bf16
    intra_node: Link = DEFAULT_INTRA_NODE
    inter_node: Link = DEFAULT_INTER_NODE
    host_memory: float | None = 2e12  # per node (DGX A100 640GB and DGX H100: 2 TB); None: not checked
    compute_efficiency: float = 0.5
    memory_headroom: float = 0.1
    pcie: float = 25e9
    cpu_adam_rate: float = 1e9

    @property
    def usable_memory(self) -> float:
        return self.gpu_memory * (1 - self.memory_headroom)


@dataclass(frozen=True)
class Candidate:
    """One layout the search tried, with its memory and estimated step time broken down (seconds)."""

    setup: TrainingSetup
    memory: MemoryPlan
    comm: CommunicationPlan
    compute: float  # matrix work of the step on one GPU, recomputation included, no bubble
    bubble: float  # pipeline idle time
    tp_pp_comm: float  # tensor- and pipeline-parallel communication (on the critical path)
    dp_exposed: float  # data-parallel communication not hidden behind compute
    offload: float  # host-device copies and the CPU optimizer step (cpu_offload)
    fits: bool
    host_fits: bool

    @property
    def step_time(self) -> float:
        return self.compute + self.bubble + self.tp_pp_comm + self.dp_exposed + self.offload

    @property
    def category(self) -> str:
        """The seed 003 row this layout belongs to."""
        s = self.setup
        if s.tp > 1 or s.pp > 1:
            return "3-D (TP+PP+DP)" if s.tp > 1 and s.pp > 1 else f"{'TP' if s.tp > 1 else 'PP'} + DP"
        if s.cpu_offload:
            return "ZeRO-3 + CPU offload"
        return {0: "DDP", 1: "FSDP (ZeRO-2)", 2: "FSDP (ZeRO-2)", 3: "ZeRO-3 (FSDP)"}[s.zero]

    @property
    def simplicity(self) -> tuple[int, ...]:
        """Fewer moving parts first, to order layouts of equal estimated time."""
        s = self.setup
        return (int(s.cpu_offload), s.tp * s.pp, s.zero, int(s.activation_checkpointing), s.micro_batches or 1)


@dataclass(frozen=True)
class SeedRow:
    """A row of seed 003's framework-selection table (DeepSpeed doc, 训练规模推荐)."""

    sizes: str
    gpus: str
    recommends: str
    categories: tuple[str, ...]  # the planner categories that count as following it


#: Seed 003: <1B on 1-8 GPUs -> DDP; 1B-10B on 8-64 -> FSDP (ZeRO-2); 10B-100B on 64-512 -> ZeRO-3 + CPU offload;
#: 100B+ on 512+ -> Megatron 3-D.
SEED_TABLE: tuple[tuple[float, SeedRow], ...] = (
    (1e9, SeedRow("<1B", "1-8", "PyTorch DDP", ("DDP",))),
    (10e9, SeedRow("1B-10B", "8-64", "PyTorch FSDP (ZeRO-2 equivalent)", ("FSDP (ZeRO-2)",))),
    (100e9, SeedRow("10B-100B", "64-512", "DeepSpeed ZeRO-3 + CPU offload", ("ZeRO-3 + CPU offload",))),
    (float("inf"), SeedRow("100B+", "512+", "Megatron-LM 3-D (TP+PP+DP)", ("3-D (TP+PP+DP)",))),
)


def seed_row(params: float) -> SeedRow:
    """The seed 003 row for a model of ``params`` parameters."""
    return next(row for limit, row in SEED_TABLE if params < limit)


@dataclass(frozen=True)
class AutoPlan:
    """The ranked layouts that fit, the search's size, and how the choice compares with seed 003."""

    hardware: Hardware
    ranked: list[Candidate]  # best first, one per (tp, pp, zero, cpu_offload) layout
    searched: int
    fitting: int
    shape_assumed: bool
    seed: SeedRow
    seed_note: str
    smallest: Candidate | None  # the least memory of all tried, to say why nothing fits


def derived_shape(params: float) -> tuple[int, int, int]:
    """A GPT-family ``(layers, hidden, heads)`` of about ``params`` parameters: ``hidden ≈ 128 × layers`` as in
    GPT-3 6.7B/13B/175B, layers a multiple of 4, hidden a multiple of 1024 (256 below 2048), head size 128 (64
    below 2048). ``derived_shape(70e9) == (72, 9216, 72)``."""
    layers = max(4, 4 * round((params / (12 * 128**2)) ** (1 / 3) / 4))
    raw = (params / (12 * layers)) ** 0.5
    step = 1024 if raw >= 2048 else 256
    hidden = max(step, step * round(raw / step))
    return layers, hidden, hidden // (128 if hidden >= 2048 else 64)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _estimate(setup: TrainingSetup, hardware: Hardware) -> Candidate:
    memory = plan_memory(setup)
    comm = plan_communication(setup, hardware.intra_node, hardware.inter_node)
    assert setup.seq is not None and setup.layers is not None and setup.hidden is not None
    m = setup.micro_batches or 1
    tokens = setup.micro_batch * m * setup.dp * setup.seq
    per_token = 6 * setup.params + 12 * setup.layers * setup.hidden * setup.seq  # forward + backward
    if setup.activation_checkpointing:
        per_token *= 4 / 3  # the forward again, in backward
    compute = tokens * per_token / (setup.world_size * hardware.gpu_flops * hardware.compute_efficiency)
    bubble = compute * comm.bubble_fraction / (1 - comm.bubble_fraction)
    tp_pp = sum(c.seconds_per_step for c in comm.collectives if c.group != "dp")
    dp = sum(c.seconds_per_step for c in comm.collectives if c.group == "dp")
    # DDP and ZeRO-1/2 overlap gradient communication with backward (2/3 of the work); ZeRO-3 also gathers
    # parameters ahead of forward, so all of the compute can hide it.
    window = compute if setup.zero >= 3 else compute * 2 / 3
    offload = 0.0
    if setup.cpu_offload:
        shard = setup.params_per_gpu / setup.dp
        gathers = 2 * m if setup.zero >= 3 else 1
        copies = shard * 4 * (gathers + m)  # float32 shard to the GPU per all-gather, gradients back per reduce
        offload = copies / hardware.pcie + shard / (hardware.cpu_adam_rate / setup.gpus)
    host_needed = memory.offloaded_to_host * setup.gpus
    return Candidate(
        setup=setup,
        memory=memory,
        comm=comm,
        compute=compute,
        bubble=bubble,
        tp_pp_comm=tp_pp,
        dp_exposed=max(0.0, dp - window),
        offload=offload,
        fits=memory.total <= hardware.usable_memory,
        host_fits=hardware.host_memory is None or host_needed <= hardware.host_memory,
    )


def _layouts(model: dict[str, Any], hardware: Hardware, global_batch: int) -> list[TrainingSetup]:
    """Every (tp, pp, schedule, zero, offload, checkpointing, micro-batch) the library can build for the model."""
    world = hardware.gpus * hardware.nodes
    layers, heads = model["layers"], model["heads"]
    found: list[TrainingSetup] = []
    for tp in _divisors(hardware.gpus):  # tensor parallelism stays inside a node
        if heads % tp:
            continue
        for pp in _divisors(world // tp):
            dp = world // (tp * pp)
            if layers % pp or global_batch % dp:
                continue
            schedules = ["1F1B", "GPipe", "Interleaved1F1B"] if pp > 1 else ["1F1B"]
            # DDP cannot wrap tensor-parallel layers and parallelize's bf16 needs FSDP: zero 0 is for pure DP.
            # With one replica, stages 2 and 3 shard nothing: FSDP runs only for mixed precision.
            if dp == 1:
                stages = [0] if tp * pp == 1 else [2]
            else:
                stages = [0, 2, 3] if tp * pp == 1 or model["dtype"] == "fp32" else [2, 3]
            per_replica = global_batch // dp
            micro_batches = [b for b in (1, 2, 4, 8, 16, 32) if per_replica % b == 0]
            for zero in stages:
                for cpu_offload in ([False, True] if zero == 3 else [False]):
                    for checkpointing in (False, True):
                        for micro in micro_batches:
                            m = per_replica // micro
                            for schedule in schedules:
                                if pp > 1 and not _schedule_runs(schedule, m, pp, layers):
                                    continue
                                found.append(
                                    TrainingSetup(
                                        **model, gpus=hardware.gpus, nodes=hardware.nodes, tp=tp, pp=pp,
                                        zero=zero, cpu_offload=cpu_offload, activation_checkpointing=checkpointing,
                                        micro_batch=micro, micro_batches=m, schedule=schedule,
                                    )  # fmt: skip
                                )
    return found


def _schedule_runs(schedule: str, m: int, pp: int, layers: int) -> bool:
    """The library's micro-batch rules (trainjob.torch.parallel.pipeline.check_microbatches), kept to safe cases."""
    if schedule == "1F1B":
        return m >= pp
    if schedule == "Interleaved1F1B":
        return m % pp == 0 and layers % (2 * pp) == 0
    return True


_AUTO_FIXED = ("zero", "tp", "pp", "micro_batch", "micro_batches", "offload", "cpu_offload", "schedule")


def plan_auto(
    hardware: Hardware, *, global_batch: int = 512, top: int = 5, **model: Any
) -> AutoPlan:
    """Search the layouts of ``model`` on ``hardware`` that fit, ranked by estimated step time (best first).

    ``model`` is :class:`TrainingSetup`'s model fields: ``params`` and/or ``layers``, ``hidden``, ``heads``, ``seq``,
    ``vocab``, ``dtype``, ``optimizer``, ``flash_attention``. Without ``layers``/``hidden``/``heads`` a GPT-family
    shape is assumed from ``params`` (:func:`derived_shape`); ``seq`` defaults to 2048. ``global_batch`` is in
    sequences. The layout fields (``zero``, ``tp``, ``pp``, micro-batching, offload) are what the search chooses.

    >>> plan = plan_auto(Hardware(gpus=8, nodes=1, gpu_memory=80e9), params=0.5e9)
    >>> best = plan.ranked[0]; (best.category, best.setup.dp)
    ('DDP', 8)
    """
    for name in _AUTO_FIXED:
        if name in model:
            raise ValidationError(name, "is what --auto chooses; leave it out")
    problems: list[ValidationError] = []
    for name in ("gpus", "nodes"):
        value = getattr(hardware, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(ValidationError(name, f"must be an integer >= 1, got {value!r}"))
    for name in ("gpu_memory", "gpu_flops", "pcie", "cpu_adam_rate"):
        value = getattr(hardware, name)
        if not isinstance(value, int | float) or not value > 0:
            problems.append(ValidationError(name, f"must be > 0, got {value!r}"))
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        problems.append(ValidationError("global_batch", f"must be an integer >= 1, got {global_batch!r}"))
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        problems.append(ValidationError("top", f"must be an integer >= 1, got {top!r}"))
    if problems:
        raise ValidationError.combine(problems)
    # Validate the model on its own (a one-GPU setup) before searching: bad fields are named once, not per layout.
    probe = TrainingSetup(**model)
    shape_assumed = None in (model.get("layers"), model.get("hidden"), model.get("heads"))
    if shape_assumed:
        given = [name for name in ("layers", "hidden", "heads") if model.get(name) is not None]
        if given:
            raise ValidationError(
                given[0], "give all of layers, hidden and heads (or none, to assume a shape from params)"
            )
        layers, hidden, heads = derived_shape(probe.params)  # type: ignore[arg-type]
        model = {**model, "layers": layers, "hidden": hidden, "heads": heads}
    model = {**model, "params": probe.params, "seq": model.get("seq") or 2048}
    model.setdefault("dtype", "bf16")
    setups = _layouts(model, hardware, global_batch)
    if not setups:
        raise ValidationError(
            "global_batch",
            f"no layout divides a global batch of {global_batch} sequences over {hardware.gpus * hardware.nodes} GPUs "
            "into whole micro-batches; use a multiple of the GPU count",
        )
    candidates = [_estimate(setup, hardware) for setup in setups]
    fitting = [c for c in candidates if c.fits and c.host_fits]
    fitting.sort(key=lambda c: (c.step_time, c.simplicity))
    best_per_layout: dict[tuple[int, int, int, bool], Candidate] = {}
    for candidate in fitting:
        s = candidate.setup
        best_per_layout.setdefault((s.tp, s.pp, s.zero, s.cpu_offload), candidate)
    ranked = list(best_per_layout.values())[:top]
    smallest = min(candidates, key=lambda c: c.memory.total)
    row = seed_row(probe.params)  # type: ignore[arg-type]
    return AutoPlan(
        hardware=hardware,
        ranked=ranked,
        searched=len(candidates),
        fitting=len(fitting),
        shape_assumed=shape_assumed,
        seed=row,
        seed_note=_seed_note(row, fitting, candidates, hardware),
        smallest=smallest,
    )


def _seed_note(row: SeedRow, fitting: list[Candidate], candidates: list[Candidate], hardware: Hardware) -> str:
    """Whether the best layout follows seed 003's table, and if not why, with numbers."""
    world = hardware.gpus * hardware.nodes
    head = f"Seed 003 recommends {row.recommends} for {row.sizes} parameters ({row.gpus} GPUs)"
    if not fitting:
        return f"{head}; nothing fits on {world} GPUs, so there is nothing to compare."
    best = fitting[0]
    if best.category in row.categories:
        return f"{head}: the planner agrees ({best.category}, {best.step_time:.3g} s/step)."
    ours = f"the planner picks {best.category} at {best.step_time:.3g} s/step"
    followers = [c for c in candidates if c.category in row.categories]
    if not followers:
        return f"{head}; {ours}: no {row.recommends} layout can be built here (e.g. it needs dp > 1 or tp/pp > 1)."
    fit_followers = [c for c in fitting if c.category in row.categories]
    if not fit_followers:
        least = min(followers, key=lambda c: c.memory.total)
        why = (
            f"no such layout fits: the smallest needs {least.memory.total / 1e9:.1f} GB per GPU, over the "
            f"{hardware.usable_memory / 1e9:.1f} GB usable of {hardware.gpu_memory / 1e9:.1f} GB"
        )
        if least.fits and not least.host_fits and hardware.host_memory is not None:
            why = (
                f"its offloaded shards need {least.memory.offloaded_to_host * least.setup.gpus / 1e9:.0f} GB of host "
                f"memory per node, over the {hardware.host_memory / 1e9:.0f} GB a node has"
            )
        return f"{head}; {ours}: {why}."
    theirs = fit_followers[0]
    return (
        f"{head}; {ours}: the best {theirs.category} layout takes {theirs.step_time:.3g} s/step "
        f"({theirs.step_time / best.step_time:.2f}x), {_cost_reason(theirs, best)}."
    )


def _cost_reason(theirs: Candidate, best: Candidate) -> str:
    """The terms by which ``theirs`` is slower than ``best``, largest first, with their seconds."""
    s = theirs.setup
    dp_bytes = sum(c.bytes_sent_per_step for c in theirs.comm.collectives if c.group == "dp")
    shard = s.params_per_gpu / s.dp
    terms = {
        "the pipeline bubble": theirs.bubble - best.bubble,
        "tensor/pipeline communication": theirs.tp_pp_comm - best.tp_pp_comm,
        f"data-parallel traffic not hidden by compute ({dp_bytes / 1e9:.1f} GB per GPU per step)": (
            theirs.dp_exposed - best.dp_exposed
        ),
        "recomputation (activation checkpointing, needed to fit)" if s.activation_checkpointing else "compute": (
            theirs.compute - best.compute
        ),
        f"offload (float32 shard of {shard / 1e9:.2f}B parameters over PCIe, Adam on the CPU)": (
            theirs.offload - best.offload
        ),
    }
    slower = sorted(((extra, name) for name, extra in terms.items() if extra > 0.005 * best.step_time), reverse=True)
    if not slower:
        return "the same estimated time, and the planner prefers fewer moving parts"
    return ", ".join(f"{name} adds {extra:.3g} s" for extra, name in slower[:2])


def trainjob_resources(candidate: Candidate) -> dict[str, Any]:
    """The TrainJob ``spec.trainer`` fields that give the layout its GPUs: one process per GPU."""
    s = candidate.setup
    return {"numNodes": s.nodes, "numProcPerNode": s.gpus, "resourcesPerNode": {"limits": {"nvidia.com/gpu": s.gpus}}}


def realisation(candidate: Candidate) -> tuple[str, str]:
    """The trainjob.torch call that builds the layout, and how to feed it a step's batch.

    >>> plan = plan_auto(Hardware(gpus=8, nodes=1, gpu_memory=80e9), params=0.5e9)
    >>> realisation(plan.ranked[0])[0]
    'model = prepare_model(model, "ddp", mixed_precision="bf16")'
    """
    s = candidate.setup
    m = s.micro_batches or 1
    precision = f', mixed_precision="{s.dtype}"' if s.dtype != "fp32" else ""
    checkpointing = ", activation_checkpointing=True" if s.activation_checkpointing else ""
    if s.zero == 0 and s.tp == 1 and s.pp == 1:
        call = f'model = prepare_model(model, "ddp"{precision}{checkpointing})'
        if m == 1:
            return call, f"each rank's loader batch: {s.micro_batch} sequences"
        return call, (
            f"GradientAccumulation(model, micro_steps={m}) over loader batches of {s.micro_batch} sequences "
            "(one all-reduce per step)"
        )
    dims = f"ParallelDims(dp_shard={s.dp}, tp={s.tp}, pp={s.pp})"
    offload = ", cpu_offload=True" if s.cpu_offload else ""
    pipeline = f', pipeline=PipelineConfig("{s.schedule}", microbatches={m})' if s.pp > 1 else ""
    call = f"model = parallelize(model, {dims}, zero_stage={s.zero}{precision}{checkpointing}{offload}{pipeline})"
    if s.pp > 1:
        return call, (
            f"model.train_step(tokens, targets) on this replica's {s.micro_batch * m} sequences per step "
            f"({m} micro-batches of {s.micro_batch})"
        )
    if m == 1:
        return call, f"model.train_step(tokens, targets) on {s.micro_batch} sequences per rank per step"
    return call, (
        f"{m} micro-batches of {s.micro_batch} sequences per step, backward on each (FSDP reduce-scatters each, as "
        "estimated; GradientAccumulation would reduce once but hold full float32 gradients)"
    )


# --------------------------------------------------------------------------------------------------------------------
# plan --ds-config: the layout a DeepSpeed config describes.

#: The ds_config keys that change the memory estimate (``deepspeed_setup`` reports these as used).
DEEPSPEED_PLAN_KEYS = (
    "zero_optimization.stage", "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
    "zero_optimization.cpu_offload", "zero_optimization.cpu_offload_params", "fp16.enabled", "bf16.enabled",
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer.type",
)  # fmt: skip


def deepspeed_setup(config: DeepSpeedConfig, **model: Any) -> tuple[TrainingSetup, DeepSpeedSettings, dict[str, Any]]:
    """The :class:`TrainingSetup` of a ds_config on ``model``'s GPUs, its settings, and the keys that set it.

    ``model`` is every TrainingSetup field the config does not give: ``params`` or the shape, ``gpus``, ``nodes``,
    ``tp``, ``pp``, ``seq``, ... The config gives ``zero`` (the stage), ``dtype`` (fp16, bf16, else fp32),
    ``optimizer``, ``micro_batch`` and ``micro_batches`` (gradient accumulation, checked against
    ``train_batch_size`` over the data-parallel ranks). ``offload_optimizer`` alone is ZeRO-Offload (``offload``);
    ``offload_param`` (stage 3) offloads the whole shard, as FSDP2's CPU offload does (``cpu_offload``)::

        setup, settings, used = deepspeed_setup("ds_config.json", params=7e9, gpus=8, nodes=4)
    """
    from trainjob.torch.deepspeed_config import map_deepspeed_config

    taken = sorted({"zero", "dtype", "optimizer", "offload", "cpu_offload", "micro_batch", "micro_batches",
                    "global_batch"} & set(model))  # fmt: skip
    if taken:
        raise ValidationError(taken[0], "comes from the DeepSpeed config; leave it out")
    world = model.get("gpus", 1) * model.get("nodes", 1)
    parallel = model.get("tp", 1) * model.get("pp", 1)
    dp = world // parallel if isinstance(world, int) and isinstance(parallel, int) and parallel >= 1 else 1
    settings = map_deepspeed_config(config, world_size=max(dp, 1))
    used = {key: settings.used[key] for key in DEEPSPEED_PLAN_KEYS if key in settings.used}
    optimizer = "adam"
    if settings.optimizer is not None:
        optimizer = settings.optimizer["type"].lower()
        if optimizer not in ("adam", "adamw", "sgd"):
            raise ValidationError(
                f"{settings.source}: optimizer.type",
                f"the planner knows Adam, AdamW and SGD optimizer states, got {settings.optimizer['type']!r}",
            )
    whole_shard = any(used.get(key) in ("cpu", True) for key in
                      ("zero_optimization.offload_param.device", "zero_optimization.cpu_offload_params"))  # fmt: skip
    if whole_shard and (model.get("layers") is None or model.get("hidden") is None):
        raise ValidationError(
            f"{settings.source}: zero_optimization.offload_param",
            "needs --layers and --hidden to estimate: the GPU then holds only the gathered blocks, whose size they give",
        )
    setup = TrainingSetup(
        **model,
        zero=settings.zero_stage,
        dtype=settings.mixed_precision or "fp32",
        optimizer=optimizer,
        offload=settings.cpu_offload and not whole_shard,
        cpu_offload=whole_shard,
        micro_batch=settings.micro_batch_size,
        micro_batches=settings.gradient_accumulation_steps,
    )
    return setup, settings, used
