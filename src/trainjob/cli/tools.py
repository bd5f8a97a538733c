"""``trainjob plan``, ``trainjob check`` and ``trainjob bench collectives``: tools for planning and checking a run.

    trainjob plan --params 7e9 --gpus 8 --nodes 2 --zero 3 --gpu-memory 80Gi
    trainjob plan --layers 96 --hidden 12288 --heads 96 --seq 2048 --micro-batch 4 --global-batch 512 \\
        --tp 8 --pp 4 --gpus 8 --nodes 8 --dtype fp16 -o json
    trainjob plan --auto --params 70B --gpus 8 --nodes 8 --gpu-memory 80GB --bandwidth intra=300GB/s,inter=25GB/s
    trainjob plan --ds-config ds_config.json --params 7B --gpus 8 --nodes 4 --gpu-memory 80GB
    trainjob plan --megatron-args "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 ..." \\
        --gpus 8 --nodes 64 --gpu-memory 80Gi
    trainjob check train.py
    trainjob bench collectives --op all_reduce --nproc 2 --min-bytes 1K --max-bytes 1M

Bad input exits with status 2 and names the flag, the value and what is accepted; ``check`` exits 1 when it finds
errors.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, NoReturn

import click
import rich

from trainjob.cli.plumbing import EXIT_BAD_INPUT, EXIT_FAILED, exit_with, fail, note
from trainjob.errors import ValidationError
from trainjob.tools.comm import COLLECTIVES, Link
from trainjob.tools.sizing.communication import DEFAULT_INTER_NODE, DEFAULT_INTRA_NODE, estimate_communication
from trainjob.tools.sizing.deepspeed import deepspeed_setup
from trainjob.tools.sizing.layout_search import Hardware, search_layouts
from trainjob.tools.sizing.memory import estimate_memory
from trainjob.tools.training_setup import TrainingSetup
from trainjob.units import parse_bandwidth, parse_bytes, parse_count


def register(group: click.Group) -> None:
    """Add this module's commands to the ``trainjob`` group."""
    group.add_command(plan)
    group.add_command(check)
    group.add_command(bench)


def _flag(path: str) -> str:
    return "--" + path.replace("_", "-")


def _fail(exc: ValidationError, *, paths_are_flags: bool = True) -> NoReturn:
    """Print each problem on stderr, naming the flag (``--zero``) or, for files, the file; exit 2."""
    lines = []
    for error in exc.errors:
        where = (_flag(error.path) if paths_are_flags else error.path) if error.path else ""
        lines.append(f"{where}: {error.message}" if where else error.message)
    fail("\n".join(lines), EXIT_BAD_INPUT)


def _links(values: tuple[str, ...]) -> tuple[Link, Link]:
    bandwidth = {"intra": DEFAULT_INTRA_NODE.bandwidth, "inter": DEFAULT_INTER_NODE.bandwidth}
    for item in (part for value in values for part in value.split(",") if part):
        key, sep, text = item.partition("=")
        if not sep or key not in bandwidth:
            raise ValidationError("bandwidth", f"must look like intra=300GB/s or inter=25GB/s, got {item!r}")
        bandwidth[key] = parse_bandwidth(text, field="bandwidth")
    return (
        Link(bandwidth["intra"], DEFAULT_INTRA_NODE.latency),
        Link(bandwidth["inter"], DEFAULT_INTER_NODE.latency),
    )


# Flags whose value --auto chooses itself, and their defaults (given anything else, --auto refuses them).
_AUTO_CHOOSES = {"zero": 0, "tp": 1, "pp": 1, "micro_batch": 1, "micro_batches": None, "offload": False,
                 "cpu_offload": False, "activation_checkpointing": False, "schedule": "1F1B"}  # fmt: skip


@click.command()
@click.option(
    "--params", help="Parameter count: 7e9, 7B, 350M. Derived from --layers/--hidden when left out."
)
@click.option("--layers", type=int, help="Transformer layers.")
@click.option("--hidden", type=int, help="Hidden size.")
@click.option("--heads", type=int, help="Attention heads.")
@click.option("--seq", type=int, help="Sequence length (--auto: 2048 unless given).")
@click.option("--vocab", type=int, help="Vocabulary size (adds vocab × hidden parameters when derived).")
@click.option("--micro-batch", type=int, default=1, show_default=True, help="Micro-batch size per GPU.")
@click.option(
    "--micro-batches", type=int, help="Micro-batches per step (gradient accumulation / pipeline m)."
)
@click.option(
    "--global-batch", type=int, help="Global batch; sets micro-batches = global / (micro-batch × dp). --auto: 512."
)
@click.option("--gpus", type=int, default=1, show_default=True, help="GPUs per node.")
@click.option("--nodes", type=int, default=1, show_default=True, help="Nodes.")
@click.option(
    "--zero", type=int, default=0, show_default=True, help="ZeRO stage 0, 1, 2 or 3 (3 = FSDP full shard)."
)
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel degree.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel degree.")
@click.option("--schedule", default="1F1B", show_default=True, help="Pipeline schedule: 1F1B, GPipe, Interleaved1F1B.")
@click.option("--dtype", default="bf16", show_default=True, help="bf16, fp16 (mixed precision) or fp32.")
@click.option("--optimizer", default="adam", show_default=True, help="adam, adamw or sgd (with momentum).")
@click.option("--offload", is_flag=True, help="Keep optimizer states in host memory (needs --zero >= 1).")
@click.option(
    "--cpu-offload", is_flag=True, help="FSDP2 CPU offload, as parallelize(cpu_offload=True): shards in host memory."
)
@click.option("--activation-checkpointing", is_flag=True, help="Count checkpointed activations in the total.")
@click.option(
    "--flash-attention", is_flag=True, help="Fused attention: no s×s score matrices in activations."
)
@click.option("--gpu-memory", help="Memory of one GPU (80Gi, 40GB) to say whether the plan fits.")
@click.option(
    "--bandwidth", multiple=True, help="Per-GPU link speeds: intra=300GB/s,inter=25GB/s (repeatable)."
)
@click.option("--auto", "auto", is_flag=True, help="Search ZeRO, TP, PP, schedule, checkpointing, offload, micro-batch.")
@click.option(
    "--ds-config", type=click.Path(dir_okay=False, path_type=Path),
    help="DeepSpeed ds_config.json: ZeRO stage, offload, precision, optimizer and batch sizes come from it.",
)  # fmt: skip
@click.option(
    "--megatron-args",
    help="A Megatron-LM pretrain_gpt.py command line (or just its flags): layout, shape, batch and precision come "
    "from it.",
)
@click.option("--gpu-tflops", type=float, default=312.0, show_default=True, help="--auto: dense peak per GPU.")
@click.option("--host-memory", help="--auto: host memory per node for CPU offload (default 2TB).")
@click.option("--top", type=int, default=5, show_default=True, help="--auto: layouts to print.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def plan(
    params: str | None, gpu_memory: str | None, bandwidth: tuple[str, ...], output: str, auto: bool,
    gpu_tflops: float, host_memory: str | None, top: int, ds_config: Path | None, megatron_args: str | None,
    **fields: Any,
) -> None:  # fmt: skip
    """Estimate per-GPU memory and per-step communication of a training run, or (--auto) find the best layouts."""
    if megatron_args is not None:
        _plan_megatron(megatron_args, params, gpu_memory, bandwidth, output, fields)
        return
    if auto and ds_config is None:
        _search_layouts(params, gpu_memory, bandwidth, output, gpu_tflops, host_memory, top, fields)
        return
    used: dict[str, Any] | None = None
    try:
        given = click.get_current_context().get_parameter_source
        for name in ("gpu_tflops", "host_memory", "top"):
            if given(name) == click.core.ParameterSource.COMMANDLINE:
                raise ValidationError(name, "is an option of --auto")
        if auto:
            raise ValidationError("auto", "searches the layouts itself: leave --ds-config out, or --auto")
        count = parse_count(params, field="params") if params else None
        capacity = parse_bytes(gpu_memory, field="gpu_memory") if gpu_memory else None
        intra, inter = _links(bandwidth)
        if ds_config is None:
            setup = TrainingSetup(params=count, **fields)
        else:
            setup, settings, used = _ds_config_setup(ds_config, count, fields, given)
    except ValidationError as exc:
        _fail(exc)
    from trainjob.tools.sizing.report import ds_config_lines, estimate_tables, estimate_to_dict

    memory, comm = estimate_memory(setup), estimate_communication(setup, intra, inter)
    if output == "json":
        data = estimate_to_dict(memory, comm, capacity)
        if used is not None:
            data["ds_config"] = {"path": settings.source, "used": used, "ignored": settings.ignored,
                                 "unknown": settings.unknown, "auto": settings.auto}  # fmt: skip
        click.echo(json.dumps(data, indent=2))
    else:
        if used is not None:
            # soft_wrap: a long config path stays one line (copyable) instead of being broken at the terminal width
            rich.get_console().print(ds_config_lines(settings.source, used, settings.ignored, settings.unknown),
                                     soft_wrap=True)
        rich.print(estimate_tables(memory, comm, capacity))


# TrainingSetup fields a DeepSpeed config sets: given with --ds-config they are refused, not silently overridden.
_DS_CONFIG_SETS = ("zero", "dtype", "optimizer", "offload", "cpu_offload", "micro_batch", "micro_batches", "global_batch")


def _ds_config_setup(path: Path, params: float | None, fields: dict[str, Any], given: Any) -> Any:
    """``deepspeed_setup`` for ``plan --ds-config``; flags the config decides are refused, naming the key."""
    for name in _DS_CONFIG_SETS:
        if given(name) == click.core.ParameterSource.COMMANDLINE:
            raise ValidationError(name, f"comes from --ds-config {path}; leave it out")
    model = {name: value for name, value in fields.items() if name not in _DS_CONFIG_SETS}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = deepspeed_setup(path, params=params, **model)
        except ValidationError as exc:
            # The config's own problems name the file and key, not a flag.
            ours = (str(path), "deepspeed_config")
            if all(error.path in ours or error.path.startswith(f"{path}: ") for error in exc.errors):
                _fail(exc, paths_are_flags=False)
            raise
    for warning in caught:
        note(f"warning: {warning.message}")
    return result


# TrainingSetup fields a Megatron-LM command line sets: given with --megatron-args they are refused.
_MEGATRON_SETS = ("tp", "pp", "layers", "hidden", "heads", "seq", "micro_batch", "micro_batches", "global_batch",
                  "dtype", "zero", "optimizer", "schedule", "activation_checkpointing", "flash_attention", "offload",
                  "cpu_offload")  # fmt: skip


def _plan_megatron(
    text: str, params: str | None, gpu_memory: str | None, bandwidth: tuple[str, ...], output: str,
    fields: dict[str, Any],
) -> None:  # fmt: skip
    """``plan --megatron-args``: the planner's estimate for the layout a Megatron-LM command line describes."""
    import shlex

    from trainjob.tools.megatron import ASSUMPTIONS, find_megatron_launch, megatron_setup, parse_megatron_args

    given = click.get_current_context().get_parameter_source
    try:
        for name in (*_MEGATRON_SETS, "ds_config", "auto", "gpu_tflops", "host_memory", "top"):
            if given(name) == click.core.ParameterSource.COMMANDLINE:
                raise ValidationError(name, "comes from --megatron-args or does not apply to it; leave it out")
        try:
            tokens = shlex.split(text, comments=True)
        except ValueError as exc:
            raise ValidationError("megatron_args", f"cannot be split like a shell line: {exc}") from None
        launch = find_megatron_launch(tokens)
        try:
            args = parse_megatron_args(launch.args if launch else tokens)
            setup = megatron_setup(args, gpus=fields["gpus"], nodes=fields["nodes"], vocab=fields["vocab"],
                                   params=parse_count(params, field="params") if params else None)  # fmt: skip
        except ValidationError as exc:
            # Name the Megatron-LM flag after --megatron-args: "--megatron-args: --num-layers: must be ...".
            raise ValidationError.combine([
                ValidationError("megatron_args", f"{e.path}: {e.message}" if e.path else e.message)
                for e in exc.errors
            ]) from None
        capacity = parse_bytes(gpu_memory, field="gpu_memory") if gpu_memory else None
        intra, inter = _links(bandwidth)
    except ValidationError as exc:
        _fail(exc)
    from trainjob.tools.sizing.report import estimate_tables, estimate_to_dict

    memory, comm = estimate_memory(setup), estimate_communication(setup, intra, inter)
    if output == "json":
        data = estimate_to_dict(memory, comm, capacity)
        data["megatron"] = {"args": {k: v for k, v in vars(args).items() if k != "unresolved"},
                            "assumptions": list(ASSUMPTIONS)}  # fmt: skip
        click.echo(json.dumps(data, indent=2))
        return
    recompute = {"selective": "selective recomputation", "full": "full recomputation", None: "no recomputation"}
    layout = (
        f"Megatron-LM: tp {args.tp} × pp {args.pp} × dp {setup.dp} on {setup.world_size} GPUs, "
        f"{setup.micro_batches} micro-batches of {setup.micro_batch} per step, {args.dtype}, "
        f"{'distributed optimizer (ZeRO-1)' if args.distributed_optimizer else 'optimizer states on every dp rank'}, "
        f"{'sequence parallel' if args.sequence_parallel else 'no sequence parallel'}, {recompute[args.recompute]}"
        + (", flash attention" if args.flash_attention else "")
    )
    console = rich.get_console()
    console.print(layout, soft_wrap=True, markup=False)
    console.print("assumptions:\n" + "\n".join(f"  - {line}" for line in ASSUMPTIONS) + "\n", markup=False)
    rich.print(estimate_tables(memory, comm, capacity))
    if capacity is not None:
        fits, gib = memory.total <= capacity, 2**30
        console.print(
            f"{'fits' if fits else 'does not fit'}: {memory.total / gib:.1f} GiB per GPU "
            f"({memory.model_states / gib:.1f} GiB model states + {(memory.total - memory.model_states) / gib:.1f} "
            f"GiB activations) {'within' if fits else 'over'} {capacity / gib:.0f} GiB",
            style="green" if fits else "red", markup=False, soft_wrap=True,
        )  # fmt: skip


def _search_layouts(
    params: str | None, gpu_memory: str | None, bandwidth: tuple[str, ...], output: str, gpu_tflops: float,
    host_memory: str | None, top: int, fields: dict[str, Any],
) -> None:  # fmt: skip
    try:
        for name, default in _AUTO_CHOOSES.items():
            if fields.pop(name) != default:
                raise ValidationError(name, "is what --auto chooses; leave it out")
        if gpu_memory is None:
            raise ValidationError("gpu_memory", "is needed with --auto: the memory of one GPU (80GB, 80Gi)")
        if not gpu_tflops > 0:
            raise ValidationError("gpu_tflops", f"must be > 0, got {gpu_tflops}")
        intra, inter = _links(bandwidth)
        gpus, nodes = fields.pop("gpus"), fields.pop("nodes")
        global_batch = fields.pop("global_batch") or 512
        hardware = Hardware(
            gpus=gpus, nodes=nodes, gpu_memory=parse_bytes(gpu_memory, field="gpu_memory"),
            gpu_flops=gpu_tflops * 1e12, intra_node=intra, inter_node=inter,
            host_memory=parse_bytes(host_memory, field="host_memory") if host_memory else 2e12,
        )  # fmt: skip
        model = {k: v for k, v in fields.items() if v is not None}
        if params:
            model["params"] = parse_count(params, field="params")
        result = search_layouts(hardware, global_batch=global_batch, top=top, **model)
    except ValidationError as exc:
        _fail(exc)
    from trainjob.tools.sizing.report import layout_search_tables, layout_search_to_dict

    if output == "json":
        click.echo(json.dumps(layout_search_to_dict(result), indent=2))
    else:
        from rich.console import Console

        console = Console()
        if console.width < 120:  # the layout table and the parallelize calls need the room
            console = Console(width=120)
        console.print(layout_search_tables(result))
    if not result.ranked:
        exit_with(EXIT_FAILED)


@click.command()
@click.argument("scripts", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--ignore", multiple=True, help="Rule id or name to skip (TJ005, unguarded-print); repeatable.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def check(scripts: tuple[Path, ...], ignore: tuple[str, ...], output: str) -> None:
    """Find distributed-training mistakes in training scripts and job manifests (exit 1 when there are errors)."""
    from trainjob.tools.check_rules import MANIFEST_RULES, RULES
    from trainjob.tools.checker import check_file

    every = (*RULES, *MANIFEST_RULES)
    known = {rule.id for rule in every} | {rule.name for rule in every}
    unknown = [name for name in ignore if name not in known]
    if unknown:
        _fail(
            ValidationError("ignore", f"unknown rule {unknown[0]!r}; rules are TJ001 to TJ{len(every):03d}")
        )
    try:
        findings = [f for script in scripts for f in check_file(script, frozenset(ignore))]
    except ValidationError as exc:
        _fail(exc, paths_are_flags=False)
    if output == "json":
        click.echo(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        for finding in findings:
            click.echo(finding.render())
        counts = {level: sum(f.severity == level for f in findings) for level in ("error", "warning", "hint")}
        summary = ", ".join(f"{n} {level}{'s' if n != 1 else ''}" for level, n in counts.items())
        manifests = sum(path.suffix in (".yaml", ".yml", ".json") for path in scripts)
        checked = [(len(scripts) - manifests, "script"), (manifests, "manifest")]
        what = " and ".join(f"{n} {kind}{'s' if n != 1 else ''}" for n, kind in checked if n) or "0 scripts"
        click.echo(f"{what} checked: {summary}")
    if any(f.severity == "error" for f in findings):
        exit_with(EXIT_FAILED)


@click.group()
def bench() -> None:
    """Measure this machine: collective bandwidth in the style of nccl-tests."""


@bench.command("collectives")
@click.option("--op", "ops", multiple=True, default=["all_reduce"], show_default=True,
              help=f"Collective to time: {', '.join(COLLECTIVES)}; repeatable.")  # fmt: skip
@click.option("--nproc", type=int, default=2, show_default=True, help="Processes (ranks) on this machine.")
@click.option("-b", "--min-bytes", default="1K", show_default=True, help="Smallest buffer (1K = 1024 bytes).")
@click.option("-e", "--max-bytes", default="1M", show_default=True, help="Largest buffer.")
@click.option("-f", "--factor", type=int, default=2, show_default=True, help="Size multiplier between rows.")
@click.option("-n", "--iters", type=int, default=20, show_default=True, help="Timed calls per size.")
@click.option("-w", "--warmup", type=int, default=5, show_default=True, help="Untimed calls per size first.")
@click.option("--dtype", default="float", show_default=True, help="float, double, half, bfloat16 or int32.")
@click.option("--backend", default="gloo", show_default=True, help="gloo (CPU) or nccl (one GPU per rank).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def bench_collectives(
    ops: tuple[str, ...], nproc: int, min_bytes: str, max_bytes: str, factor: int, iters: int, warmup: int,
    dtype: str, backend: str, output: str,
) -> None:  # fmt: skip
    """Time collectives over a range of sizes; exit 1 if any result is wrong."""
    from trainjob.tools.collectives import format_table, run_collectives
    from trainjob.torch.testing import DistributedRunError

    try:
        rows = run_collectives(
            list(ops), nproc, parse_bytes(min_bytes, field="min_bytes"), parse_bytes(max_bytes, field="max_bytes"),
            factor, iters, warmup, dtype, backend,
        )  # fmt: skip
    except ValidationError as exc:
        _fail(exc)
    except DistributedRunError as exc:
        fail(f"the benchmark failed: {exc}", EXIT_FAILED)
    click.echo(json.dumps([r.to_dict() for r in rows], indent=2) if output == "json" else format_table(rows))
    if any(r.wrong for r in rows):
        exit_with(EXIT_FAILED)
