"""The layout search of ``trainjob plan --auto``: every layout that fits, ranked by estimated step time.

:func:`search_layouts` (``trainjob plan --auto``) tries every layout the library can build (TP inside a node, PP, ZeRO
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
from typing import Any

from trainjob.errors import ValidationError
from trainjob.tools.comm import Link
from trainjob.tools.sizing.communication import (
    DEFAULT_INTER_NODE,
    DEFAULT_INTRA_NODE,
    CommunicationEstimate,
    estimate_communication,
)
from trainjob.tools.sizing.memory import MemoryEstimate, estimate_memory
from trainjob.tools.training_setup import TrainingSetup


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
    memory: MemoryEstimate
    comm: CommunicationEstimate
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
class LayoutSearch:
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
    memory = estimate_memory(setup)
    comm = estimate_communication(setup, hardware.intra_node, hardware.inter_node)
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


def search_layouts(
    hardware: Hardware, *, global_batch: int = 512, top: int = 5, **model: Any
) -> LayoutSearch:
    """Search the layouts of ``model`` on ``hardware`` that fit, ranked by estimated step time (best first).

    ``model`` is :class:`TrainingSetup`'s model fields: ``params`` and/or ``layers``, ``hidden``, ``heads``, ``seq``,
    ``vocab``, ``dtype``, ``optimizer``, ``flash_attention``. Without ``layers``/``hidden``/``heads`` a GPT-family
    shape is assumed from ``params`` (:func:`derived_shape`); ``seq`` defaults to 2048. ``global_batch`` is in
    sequences. The layout fields (``zero``, ``tp``, ``pp``, micro-batching, offload) are what the search chooses.

    >>> plan = search_layouts(Hardware(gpus=8, nodes=1, gpu_memory=80e9), params=0.5e9)
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
    return LayoutSearch(
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

    >>> plan = search_layouts(Hardware(gpus=8, nodes=1, gpu_memory=80e9), params=0.5e9)
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
