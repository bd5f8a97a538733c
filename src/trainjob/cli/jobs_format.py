"""Plain-text rendering of jobs for the CLI: tables, ages, durations and progress, kubectl style.

Tables are formatted by hand (no rich) so ``trainjob list`` over thousands of jobs stays instant::

    print(table(["NAME", "STATUS"], [["mnist", "Running"]]))
"""

from __future__ import annotations

from datetime import UTC, datetime

from trainjob import types


def table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns separated by three spaces, the last column unpadded."""
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            if len(cell) > widths[i]:
                widths[i] = len(cell)
    last = len(header) - 1
    formats = [f"{{:<{w}}}   " for w in widths[:last]] + ["{}"]
    pattern = "".join(formats)
    return "\n".join(pattern.format(*row).rstrip() for row in [header, *rows])


def human_duration(seconds: float | None) -> str:
    """``42s``, ``3m12s``, ``2h5m``, ``3d4h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


def job_duration(job: types.TrainJob, now: datetime) -> float | None:
    if job.start_time is None:
        return None
    return ((job.completion_time or now) - job.start_time).total_seconds()


def progress_text(progress: types.Progress | None) -> str:
    """``37% 120/320 loss=0.412 eta 1m5s`` from whatever the job reported; ``-`` when nothing was."""
    if progress is None:
        return "-"
    parts = []
    if progress.fraction is not None:
        parts.append(f"{progress.fraction:.0%} {progress.step}/{progress.total_steps}")
    elif progress.step is not None:
        parts.append(f"step {progress.step}")
    loss = progress.metrics.get("loss")
    if loss is not None:
        parts.append(f"loss={loss:.4g}")
    if progress.eta_seconds is not None:
        parts.append(f"eta {human_duration(progress.eta_seconds)}")
    return " ".join(parts) or "-"


LIST_HEADER = ["NAME", "STATUS", "NODESxPROCS", "RUNTIME", "PROGRESS", "AGE", "DURATION"]


def list_rows(jobs: list[types.TrainJob], now: datetime | None = None) -> list[list[str]]:
    now = now or datetime.now(UTC)
    return [
        [
            job.name,
            job.status,
            f"{job.num_nodes}x{job.num_proc_per_node or '?'}",
            job.runtime_name,
            progress_text(job.progress),
            human_duration((now - job.creation_timestamp).total_seconds()),
            human_duration(job_duration(job, now)),
        ]
        for job in jobs
    ]


def describe(job: types.TrainJob, now: datetime | None = None) -> str:
    """A ``kubectl describe``-like summary of one job."""
    now = now or datetime.now(UTC)
    lines = [
        f"Name:        {job.name}",
        f"Status:      {job.status}" + (f" ({job.reason})" if job.reason and job.reason != job.status else ""),
    ]
    if job.message:
        lines.append(f"Message:     {job.message}")
    lines += [
        f"Runtime:     {job.runtime_name}",
        f"Nodes:       {job.num_nodes} x {job.num_proc_per_node or '?'} process(es)",
        f"Created:     {_when(job.creation_timestamp)} ({human_duration((now - job.creation_timestamp).total_seconds())} ago)",
        f"Started:     {_when(job.start_time)}",
        f"Finished:    {_when(job.completion_time)}",
        f"Duration:    {human_duration(job_duration(job, now))}",
        f"Restarts:    {job.restarts}",
        f"Progress:    {progress_text(job.progress)}",
    ]
    if job.progress and job.progress.metrics:
        metrics = " ".join(f"{k}={v:.6g}" if v is not None else f"{k}=nan" for k, v in job.progress.metrics.items())
        lines.append(f"Metrics:     {metrics}")
    if job.steps:
        lines.append("Steps:")
        lines += ["  " + line for line in table(["STEP", "STATUS", "POD"], [[s.name, s.status or "-", s.pod_name] for s in job.steps]).splitlines()]
    return "\n".join(lines)


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S UTC")
