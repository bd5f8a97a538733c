"""Plain-text rendering of jobs for the CLI: tables, ages, durations and progress, kubectl style.

Tables are formatted by hand (no rich) so ``trainjob list`` over thousands of jobs stays instant::

    print(table(["NAME", "STATUS"], [["mnist", "Running"]]))
"""

from __future__ import annotations

from datetime import UTC, datetime

from trainjob.sdk import types


def table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns separated by three spaces, the last column unpadded."""
    all_rows = [header, *rows]
    widths = [max(map(len, column)) for column in zip(*all_rows, strict=True)]
    pattern = "   ".join(f"{{:<{w}}}" for w in widths[:-1]) + "   {}"
    return "\n".join([pattern.format(*row).rstrip() for row in all_rows])


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
    return progress_summary(progress.step, progress.total_steps, progress.metrics.get("loss"), progress.eta_seconds,
                            progress.percent)


def progress_summary(
    step: int | None, total: int | None, loss: float | None, eta: float | None, percent: float | None = None
) -> str:
    """``percent`` is what ``update_trainjob_status`` reported; it wins over step / total."""
    parts = []
    if percent is not None:
        parts.append(f"{min(100.0, max(0.0, percent)):.0f}%" + (f" {step}/{total}" if step is not None and total else ""))
    elif step is not None and total:
        parts.append(f"{min(1.0, step / total):.0%} {step}/{total}")
    elif step is not None:
        parts.append(f"step {step}")
    if loss is not None:
        parts.append(f"loss={loss:.4g}")
    if eta is not None:
        parts.append(f"eta {human_duration(eta)}")
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


def summary_rows(summaries: list[types.JobSummary], now: float) -> list[list[str]]:
    """Table rows from job summaries (``Backend.list_summaries``), ``now`` a Unix time."""
    rows = []
    for job in summaries:
        progress = progress_summary(job.step, job.total_steps, job.loss, job.eta_seconds, job.percent)
        duration = None if job.started is None else (job.finished or now) - job.started
        rows.append([job.name, job.status, f"{job.num_nodes}x{job.num_proc_per_node or '?'}", job.runtime, progress,
                     human_duration(now - job.created), human_duration(duration)])
    return rows


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
