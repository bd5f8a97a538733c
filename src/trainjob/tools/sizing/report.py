"""Print memory and communication estimates as rich tables, or turn them into JSON-ready data.

>>> from trainjob.tools.sizing.communication import estimate_communication
>>> from trainjob.tools.sizing.memory import estimate_memory
>>> from trainjob.tools.training_setup import TrainingSetup
>>> setup = TrainingSetup(params=7e9, gpus=8, nodes=2, zero=3)
>>> data = estimate_to_dict(estimate_memory(setup), estimate_communication(setup), gpu_memory=80 * 2**30)
>>> data["memory"]["model_states"], data["memory"]["fits"]
(7000000000.0, True)
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table

from trainjob.tools.sizing.communication import CommunicationEstimate
from trainjob.tools.sizing.layout_search import LayoutSearch, realisation, trainjob_resources
from trainjob.tools.sizing.memory import MemoryEstimate
from trainjob.units import format_bytes, format_seconds

__all__ = ["layout_search_tables", "layout_search_to_dict", "ds_config_lines", "estimate_tables", "estimate_to_dict"]


def _fits(memory: MemoryEstimate, gpu_memory: int | None) -> bool | None:
    return None if gpu_memory is None else memory.total <= gpu_memory


def estimate_to_dict(
    memory: MemoryEstimate, comm: CommunicationEstimate, gpu_memory: int | None = None
) -> dict[str, Any]:
    """Everything the tables show, in bytes and seconds, for ``-o json``."""
    setup = asdict(memory.setup) | {"world_size": memory.setup.world_size, "dp": memory.setup.dp}
    return {
        "setup": setup,
        "memory": {
            "parameters": memory.parameters,
            "gradients": memory.gradients,
            "optimizer_states": memory.optimizer_states,
            "model_states": memory.model_states,
            "gathered": memory.gathered,
            "activations": memory.activations,
            "activations_checkpointed": memory.activations_checkpointed,
            "total": memory.total,
            "offloaded_to_host": memory.offloaded_to_host,
            "gpu_memory": gpu_memory,
            "fits": _fits(memory, gpu_memory),
        },
        "communication": {
            "collectives": [asdict(c) for c in comm.collectives],
            "bytes_sent_per_step": comm.bytes_sent_per_step,
            "seconds_per_step": comm.seconds_per_step,
            "pipeline_bubble_fraction": comm.bubble_fraction,
        },
    }


def _memory_table(memory: MemoryEstimate, gpu_memory: int | None) -> Table:
    s = memory.setup
    title = (
        f"Memory per GPU: {s.params / 1e9:.2f}B params, {s.world_size} GPUs "
        f"(dp {s.dp} × tp {s.tp} × pp {s.pp}), ZeRO-{s.zero}, {s.dtype}, {s.optimizer}"
    )
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("item")
    table.add_column("bytes", justify="right")
    table.add_column("how")
    n = f"/{s.dp}"
    table.add_row(
        "parameters", format_bytes(memory.parameters), f"{s.value_bytes}Ψ" + (n if s.zero >= 3 else "")
    )
    table.add_row(
        "gradients", format_bytes(memory.gradients), f"{s.value_bytes}Ψ" + (n if s.zero >= 2 else "")
    )
    how = "offloaded to host" if s.offload or s.cpu_offload else ("KΨ" + (n if s.zero >= 1 else ""))
    table.add_row("optimizer states", format_bytes(memory.optimizer_states), how)
    table.add_row("model states", format_bytes(memory.model_states), "", style="bold")
    if memory.gathered:
        table.add_row("gathered blocks", format_bytes(memory.gathered), "FSDP: 2 blocks' parameters, 1 block's fp32 grads")
    if memory.activations is None or memory.activations_checkpointed is None:
        table.add_row("activations", "n/a", "give --layers --hidden --heads --seq to estimate")
    else:
        chosen = "checkpointed" if s.activation_checkpointing else "stored"
        table.add_row(
            "activations",
            format_bytes(memory.activations),
            "all stored" + (" ✓" if chosen == "stored" else ""),
        )
        table.add_row(
            "activations (checkpointed)",
            format_bytes(memory.activations_checkpointed),
            "layer inputs + one layer" + (" ✓" if chosen == "checkpointed" else ""),
        )
    table.add_row("total", format_bytes(memory.total), "model states + ✓ activations", style="bold")
    if memory.offloaded_to_host:
        table.add_row("host memory (offload)", format_bytes(memory.offloaded_to_host), "per GPU")
    fits = _fits(memory, gpu_memory)
    if fits is not None and gpu_memory is not None:
        verdict = "[green]fits[/]" if fits else "[red]does not fit[/]"
        table.add_row("GPU memory", f"{gpu_memory / 2**30:.2f} GiB", verdict)
    return table


def _comm_table(comm: CommunicationEstimate) -> Table:
    table = Table(
        title="Communication per GPU per step",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
    )
    for name, justify in (("collective", "left"), ("group", "left"), ("message", "right"), ("calls", "right"),
                          ("sent", "right"), ("time", "right")):  # fmt: skip
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for c in comm.collectives:
        table.add_row(
            c.name + (" (tree)" if c.algorithm == "tree" else ""),
            f"{c.group}={c.group_size} {'inter' if c.inter_node else 'intra'}",
            format_bytes(c.message_bytes),
            str(c.calls_per_step),
            format_bytes(c.bytes_sent_per_step),
            format_seconds(c.seconds_per_step),
        )
    if not comm.collectives:
        table.add_row("none", "single GPU", "", "", "", "")
    total = format_seconds(comm.seconds_per_step)
    table.add_row(
        "total (no overlap)", "", "", "", format_bytes(comm.bytes_sent_per_step), total, "", style="bold"
    )
    s = comm.setup
    bubble = f"{comm.bubble_fraction:.1%} = (p-1)/(m+p-1) with p={s.pp}, m={s.micro_batches}"
    table.caption = f"pipeline bubble: {bubble}" if s.pp > 1 else f"micro-batches per step: {s.micro_batches}"
    table.caption_justify = "left"
    return table


def ds_config_lines(source: str, used: dict[str, Any], ignored: list[str], unknown: list[str]) -> str:
    """What ``plan --ds-config`` took from the config: each key with its value, then what it left aside."""
    values = "".join(f"\n  {key} = {json.dumps(value)}" for key, value in used.items()) or " none"
    lines = [f"[bold]{source}[/], keys used:{values}"]
    if ignored or unknown:
        lines.append(f"not used for memory: {', '.join([*ignored, *unknown])}")
    return "\n".join(lines) + "\n"


def estimate_tables(memory: MemoryEstimate, comm: CommunicationEstimate, gpu_memory: int | None = None) -> Group:
    """Both tables, ready for ``rich.print``."""
    return Group(_memory_table(memory, gpu_memory), "", _comm_table(comm))


def _layout_name(s: Any) -> str:
    parts = [f"dp{s.dp}"] + [f"tp{s.tp}"] * (s.tp > 1) + [f"pp{s.pp}"] * (s.pp > 1)
    return "×".join(parts)


def layout_search_to_dict(plan: LayoutSearch) -> dict[str, Any]:
    """Everything ``plan --auto`` shows, for ``-o json``."""
    hw = plan.hardware
    rows = []
    for rank, c in enumerate(plan.ranked, 1):
        call, feed = realisation(c)
        rows.append(
            {
                "rank": rank,
                "category": c.category,
                "setup": asdict(c.setup) | {"dp": c.setup.dp, "world_size": c.setup.world_size},
                "memory_per_gpu": c.memory.total,
                "host_memory_per_gpu": c.memory.offloaded_to_host,
                "step_seconds": c.step_time,
                "breakdown": {
                    "compute": c.compute, "bubble": c.bubble, "tp_pp_comm": c.tp_pp_comm,
                    "dp_exposed": c.dp_exposed, "offload": c.offload,
                },  # fmt: skip
                "trainjob": {"trainer": trainjob_resources(c)},
                "call": call,
                "batch": feed,
            }
        )
    return {
        "hardware": asdict(hw) | {"usable_memory": hw.usable_memory},
        "searched": plan.searched,
        "fitting": plan.fitting,
        "shape_assumed": plan.shape_assumed,
        "ranked": rows,
        "seed": asdict(plan.seed),
        "seed_note": plan.seed_note,
    }


def _secs(value: float) -> str:
    return "0 s" if value < 5e-4 else format_seconds(value)


def layout_search_tables(plan: LayoutSearch) -> Group:
    """The ranked layouts, each one's TrainJob resources and parallelize call, and the seed comparison."""
    hw = plan.hardware
    parts: list[Any] = []
    if plan.ranked:
        s = plan.ranked[0].setup
        shape = f"{s.layers} layers, hidden {s.hidden}, {s.heads} heads" + (" assumed" if plan.shape_assumed else "")
        tokens = s.micro_batch * (s.micro_batches or 1) * s.dp * (s.seq or 0)
        parts.append(
            f"[bold]{s.params / 1e9:.2f}B parameters[/] ({shape}), seq {s.seq}, {tokens / 1e6:.2f}M tokens per step, "
            f"{s.dtype}, {s.optimizer}\n[bold]{hw.gpus * hw.nodes} GPUs[/] = {hw.nodes} nodes × {hw.gpus}, "
            f"{format_bytes(hw.gpu_memory)} each ({format_bytes(hw.usable_memory)} usable), "
            f"{hw.gpu_flops / 1e12:.0f} TFLOP/s at {hw.compute_efficiency:.0%}, links "
            f"{hw.intra_node.bandwidth / 1e9:.0f} GB/s in a node, {hw.inter_node.bandwidth / 1e9:.0f} GB/s between"
        )
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for name in ("#", "layout", "ZeRO", "ckpt", "offload", "micro", "pipeline", "mem/GPU", "step", "tokens/s"):
            table.add_column(name, justify="left" if name in ("layout", "pipeline") else "right", no_wrap=True)
        for rank, c in enumerate(plan.ranked, 1):
            s = c.setup
            m = s.micro_batches or 1
            pipeline = f"{s.schedule} {c.comm.bubble_fraction:.1%}" if s.pp > 1 else "-"
            step_tokens = s.micro_batch * m * s.dp * (s.seq or 0)
            table.add_row(
                str(rank), _layout_name(s), str(s.zero), "✓" if s.activation_checkpointing else "-",
                "CPU" if s.cpu_offload else "-", f"{s.micro_batch}×{m}", pipeline,
                f"{c.memory.total / 1e9:.1f} GB", format_seconds(c.step_time), f"{step_tokens / c.step_time:,.0f}",
            )  # fmt: skip
        table.caption = (
            f"{plan.searched} layouts searched, {plan.fitting} fit; the best of each (tp, pp, ZeRO, offload) shown. "
            "micro: micro-batch size × micro-batches per step; pipeline: schedule and bubble."
        )
        table.caption_justify = "left"
        parts.append(table)
        for rank, c in enumerate(plan.ranked, 1):
            call, feed = realisation(c)
            r = trainjob_resources(c)
            gpus = r["resourcesPerNode"]["limits"]["nvidia.com/gpu"]
            host = (
                f"; host memory {format_bytes(c.memory.offloaded_to_host * c.setup.gpus)} per node"
                if c.memory.offloaded_to_host
                else ""
            )
            parts.append(
                f"[bold]#{rank}[/] {c.category}: step {_secs(c.step_time)} = compute {_secs(c.compute)} + bubble "
                f"{_secs(c.bubble)} + TP/PP comm {_secs(c.tp_pp_comm)} + DP not hidden {_secs(c.dp_exposed)} + "
                f"offload {_secs(c.offload)}; {format_bytes(c.memory.total)} per GPU{host}\n"
                f"    trainer: {{numNodes: {r['numNodes']}, numProcPerNode: {r['numProcPerNode']}, "
                f"resourcesPerNode: {{limits: {{nvidia.com/gpu: {gpus}}}}}}}\n    {call}\n    {feed}"
            )
    else:
        least = plan.smallest
        need = f"; the smallest needs {format_bytes(least.memory.total)} per GPU" if least is not None else ""
        parts.append(
            f"[red]No layout fits[/] in {format_bytes(hw.usable_memory)} usable of {format_bytes(hw.gpu_memory)} per "
            f"GPU on {hw.gpus * hw.nodes} GPUs{need} ({plan.searched} layouts searched): add nodes or GPU memory."
        )
    parts.append("")
    parts.append(plan.seed_note)
    return Group(*parts)
