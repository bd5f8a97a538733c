"""``trainjob top [job [NAME] | node]``: what running jobs use, per job, node and rank (arena top job|node).

=========  ===================================================================================================
CPU%       the processes' CPU over the sampling interval (100% is one core), psutil
RSS        resident memory, psutil
GPU%       utilisation of the GPUs the processes use, GPU MEM the memory they hold: NVML (``nvidia-ml-py``), read
           only when this machine has NVIDIA GPUs; ``no GPU`` otherwise
STEPS/S    training steps per second over the last records ``trainjob.torch.report`` wrote (rank 0's metrics)
=========  ===================================================================================================

``top`` and ``top job`` show one row per running job; ``top job NAME`` one row per process of that job (each
node's torchrun agent, then its ranks); ``top node`` one row per node of each running job. Local backend only:
a cluster's nodes are measured by its metrics server (``kubectl top pods -l trainer.kubeflow.org/trainjob-name=NAME``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import psutil

from trainjob.cli.jobs_format import table
from trainjob.cli.plumbing import Target, backend_option, handle_errors, make_backend, note
from trainjob.constants import RUNNING
from trainjob.errors import NotFoundError, ValidationError
from trainjob.sdk import types

NO_GPU = "no GPU"
#: Steps per second are measured over the records of this many last seconds (at least two records).
RATE_WINDOW_SECONDS = 60.0


@dataclass
class Sample:
    """One process: what it is (node agent or rank) and what it uses."""

    job: str
    node: int
    rank: int | None
    pid: int
    cpu: float = 0.0
    rss: int = 0
    gpus: list[int] = field(default_factory=list)
    gpu_memory: int = 0


class Gpus:
    """NVML, when this machine has NVIDIA GPUs and ``nvidia-ml-py`` is installed: per-process memory, per-GPU use."""

    def __init__(self) -> None:
        self.nvml: Any = None
        self.utilization: dict[int, int] = {}
        self.by_pid: dict[int, list[tuple[int, int]]] = {}
        self.note = NO_GPU
        if not any(Path("/dev").glob("nvidia[0-9]*")):
            return
        try:
            import pynvml
        except ImportError:
            self.note = "GPUs present; GPU use needs nvidia-ml-py (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError: no driver, no permission
            self.note = f"GPUs present but NVML failed: {exc}"
            return
        self.nvml = pynvml
        self.note = ""
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            with contextlib.suppress(Exception):
                self.utilization[index] = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            processes = []
            with contextlib.suppress(Exception):
                processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            for process in processes:
                used = process.usedGpuMemory if isinstance(process.usedGpuMemory, int) else 0
                self.by_pid.setdefault(int(process.pid), []).append((index, used))

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def close(self) -> None:
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()

    def fill(self, sample: Sample) -> None:
        for index, used in self.by_pid.get(sample.pid, []):
            sample.gpus.append(index)
            sample.gpu_memory += used

    def percent(self, gpus: list[int]) -> str:
        used = sorted(set(gpus))
        if not used:
            return "-"
        return f"{sum(self.utilization.get(i, 0) for i in used) / len(used):.0f}"


def local_processes(backend: Any, name: str) -> list[Sample]:
    """Every process of a local job: each node's agent (torchrun) and its training processes (by ``RANK``)."""
    samples = []
    for index, node in sorted((backend.node_processes(name) or {}).items()):
        if node.status != RUNNING or not node.pid:
            continue
        try:
            keeper = psutil.Process(node.pid)
            below = keeper.children(recursive=True)
        except psutil.Error:
            continue
        for process in below:
            try:
                rank = process.environ().get("RANK")
            except psutil.Error:
                continue
            samples.append(Sample(name, index, int(rank) if rank and rank.isdigit() else None, process.pid))
    return samples


def measure(samples: list[Sample], interval: float, gpus: Gpus) -> None:
    """Fill CPU% (over ``interval`` seconds), RSS and GPU use into ``samples``; gone processes keep zeros."""
    processes = {}
    for sample in samples:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(sample.pid)
            process.cpu_percent(None)
            processes[sample.pid] = process
    time.sleep(interval)
    for sample in samples:
        process = processes.get(sample.pid)
        if process is None:
            continue
        with contextlib.suppress(psutil.Error):
            sample.cpu = process.cpu_percent(None)
            sample.rss = process.memory_info().rss
        gpus.fill(sample)


def steps_per_second(records: list[dict[str, Any]], window: float = RATE_WINDOW_SECONDS) -> float | None:
    """Steps per second over the records of the last ``window`` seconds (``time``/``step`` of each report)."""
    stepped = [r for r in records if r.get("step") is not None and r.get("time") is not None]
    if len(stepped) < 2:
        return None
    last = stepped[-1]
    recent = [r for r in stepped if r["time"] >= last["time"] - window]
    first = recent[0] if len(recent) >= 2 else stepped[-2]
    seconds = last["time"] - first["time"]
    return (last["step"] - first["step"]) / seconds if seconds > 0 else None


def _bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}GiB"


def _usage(samples: list[Sample], gpus: Gpus) -> list[str]:
    cpu = f"{sum(s.cpu for s in samples):.0f}"
    rss = _bytes(sum(s.rss for s in samples))
    if not gpus.available:
        return [cpu, rss, gpus.note or NO_GPU]
    used = [i for s in samples for i in s.gpus]
    return [cpu, rss, gpus.percent(used), _bytes(sum(s.gpu_memory for s in samples)) if used else "-"]


def _gpu_header(gpus: Gpus) -> list[str]:
    return ["GPU%", "GPU MEM"] if gpus.available else ["GPU"]


def _rate(backend: Any, name: str) -> str:
    rate = steps_per_second(backend.store.metrics(name)[-200:])
    return "-" if rate is None else f"{rate:.3g}"


@click.group("top", invoke_without_command=True)
@click.option("--interval", type=click.FloatRange(min=0.05), default=0.5, show_default=True,
              help="Seconds over which CPU use is measured.")
@click.pass_context
def top(ctx: click.Context, interval: float) -> None:
    """Show what running jobs use: CPU %, RSS, GPU use and memory, steps/s (arena top job|node)."""
    ctx.obj = {"interval": interval}
    if ctx.invoked_subcommand is None:
        ctx.invoke(top_job, name=None, backend=None, namespace=None, kubeconfig=None, context=None)


@top.command("job")
@click.argument("name", required=False)
@backend_option
@handle_errors
def top_job(name: str | None, backend: Target) -> None:
    """One row per running job; with NAME, one row per process of that job (node agents and ranks)."""
    client = _local(backend)
    interval = (click.get_current_context().find_object(dict) or {}).get("interval", 0.5)
    gpus = Gpus()
    try:
        if name is not None:
            job = client.get_job(name)
            samples = local_processes(client, name)
            if not samples:
                raise NotFoundError(f"TrainJob {name} is {job.status}: it has no running processes to show")
            measure(samples, interval, gpus)
            rows = [[f"node-{s.node}", "agent" if s.rank is None else str(s.rank), str(s.pid), *_usage([s], gpus)]
                    for s in sorted(samples, key=lambda s: (s.node, -1 if s.rank is None else s.rank))]
            click.echo(table(["NODE", "RANK", "PID", "CPU%", "RSS", *_gpu_header(gpus)], rows))
            click.echo(f"steps/s: {_rate(client, name)}")
            return
        running = [job for job in client.list_jobs() if job.status == types.RUNNING]
        per_job = {job.name: local_processes(client, job.name) for job in running}
        measure([s for samples in per_job.values() for s in samples], interval, gpus)
        rows = [[job.name, f"{job.num_nodes}x{job.num_proc_per_node}", *_usage(per_job[job.name], gpus),
                 _rate(client, job.name)] for job in running]
        if not rows:
            note("no running jobs")
            return
        click.echo(table(["NAME", "NODESxPROCS", "CPU%", "RSS", *_gpu_header(gpus), "STEPS/S"], rows))
    finally:
        gpus.close()


@top.command("node")
@backend_option
@handle_errors
def top_node(backend: Target) -> None:
    """One row per node of every running job: its ranks, CPU %, RSS and GPU use."""
    client = _local(backend)
    interval = (click.get_current_context().find_object(dict) or {}).get("interval", 0.5)
    gpus = Gpus()
    try:
        running = [job for job in client.list_jobs() if job.status == types.RUNNING]
        samples = [s for job in running for s in local_processes(client, job.name)]
        measure(samples, interval, gpus)
        rows = []
        for job in running:
            for node in range(job.num_nodes):
                mine = [s for s in samples if s.job == job.name and s.node == node]
                ranks = sorted(s.rank for s in mine if s.rank is not None)
                shown = "-" if not ranks else f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
                rows.append([job.name, f"node-{node}", shown, *_usage(mine, gpus)])
        if not rows:
            note("no running jobs")
            return
        click.echo(table(["JOB", "NODE", "RANKS", "CPU%", "RSS", *_gpu_header(gpus)], rows))
    finally:
        gpus.close()


def _local(target: Target) -> Any:
    if target.backend != "local":
        raise ValidationError(
            "--backend", "top measures processes on this machine (the local backend); on Kubernetes use the "
            "cluster's metrics server: kubectl top pods -l trainer.kubeflow.org/trainjob-name=NAME"
        )
    return make_backend(target)


def register(group: click.Group) -> None:
    group.add_command(top)
