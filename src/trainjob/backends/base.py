"""What every backend (local processes, Kubernetes) offers; ``TrainerClient`` and the CLI only talk to this.

Method names follow the Kubeflow SDK (``train``, ``list_jobs``, ``get_job_logs`` ...); ``apply``, ``logs``,
``suspend_job`` and ``resume_job`` are this project's additions. A backend raises errors from
:mod:`trainjob.errors`: ``NotFoundError`` for unknown jobs or runtimes, ``AlreadyExistsError`` for a taken name,
``ValidationError`` for bad input, ``JobFailedError`` when a waited-for job fails, ``TimeoutError`` on timeouts.

Waiting is shared: a backend's ``wait_for_job_status`` can delegate to :func:`wait_for_status`::

    job = wait_for_status(backend.get_job, "mnist", {"Complete"}, timeout=600, polling_interval=2)

``train`` takes the Kubeflow SDK's trainers (``CustomTrainer``, ``CustomTrainerContainer``) and ``options``
(:mod:`trainjob.options`); ``get_runtime_packages`` prints what a runtime's trainer runs with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trainjob import types
from trainjob.errors import JobFailedError, ValidationError

if TYPE_CHECKING:
    from trainjob.api import Runtime as RuntimeResource
    from trainjob.api import TrainJob as TrainJobResource


@runtime_checkable
class Backend(Protocol):
    """Runs TrainJobs somewhere and reports on them."""

    def train(
        self,
        runtime: types.Runtime | str | None = None,
        initializer: Any | None = None,
        trainer: types.CustomTrainer | types.CustomTrainerContainer | None = None,
        options: Sequence[Any] | None = None,
    ) -> str:
        """Create a job from an SDK trainer and options; returns its name."""
        ...

    def get_runtime_packages(self, runtime: types.Runtime | str) -> None:
        """Print the Python version, the installed packages and the GPUs a job on ``runtime`` runs with."""
        ...

    def apply(
        self, trainjob: TrainJobResource, runtimes: Sequence[RuntimeResource] = ()
    ) -> types.TrainJob:
        """Create ``trainjob``; its runtime is found among ``runtimes`` first, then the built-ins."""
        ...

    def list_jobs(self, runtime: types.Runtime | None = None) -> list[types.TrainJob]: ...

    def get_job(self, name: str) -> types.TrainJob: ...

    def get_job_logs(self, name: str, step: str = "node-0", follow: bool = False) -> Iterator[str]: ...

    def logs(
        self,
        name: str,
        node: int | None = None,
        rank: int | None = None,
        follow: bool = False,
        *,
        since: float | None = None,
        tail: int | None = None,
        previous: bool = False,
        stop_output: bool = False,
    ) -> Iterator[types.LogLine]:
        """Lines of every node (or one ``node``, or one global ``rank``), merged by the time they were written:
        only those since ``since`` (Unix time), the last ``tail``, of the attempt before the last restart
        (``previous``); a ``node``/``rank`` pair that names no process is a ``ValidationError``."""
        ...

    def wait_for_job_status(
        self,
        name: str,
        status: set[str] | frozenset[str] = frozenset({types.COMPLETE}),
        timeout: float = 600,
        polling_interval: float = 2,
        callbacks: Sequence[Callable[[types.TrainJob], None]] | None = None,
    ) -> types.TrainJob: ...

    def delete_job(self, name: str) -> None: ...

    def suspend_job(self, name: str) -> None: ...

    def resume_job(self, name: str) -> None: ...

    def get_job_events(self, name: str) -> list[types.Event]: ...

    def list_runtimes(self) -> list[types.Runtime]: ...

    def get_runtime(self, name: str) -> types.Runtime: ...


def check_wanted_statuses(status: Iterable[str]) -> frozenset[str]:
    """The wanted statuses as a set; raises ``ValidationError`` naming the accepted ones."""
    wanted = frozenset({status} if isinstance(status, str) else status)
    unknown = sorted(wanted - set(types.STATUSES))
    if not wanted or unknown:
        raise ValidationError(
            "status", f"must be a non-empty subset of {', '.join(types.STATUSES)}, got {sorted(wanted)}"
        )
    return wanted


def wait_for_status(
    get_job: Callable[[str], types.TrainJob],
    name: str,
    status: Iterable[str],
    timeout: float,
    polling_interval: float,
    callbacks: Sequence[Callable[[types.TrainJob], None]] | None = None,
    check_interval: float | None = None,
) -> types.TrainJob:
    """Poll ``get_job(name)`` until its status is in ``status``.

    Raises :class:`JobFailedError` as soon as the job is ``Failed`` (unless ``Failed`` is wanted) with the
    job's reason and message, and :class:`TimeoutError` after ``timeout`` seconds. The job is read every
    ``check_interval`` seconds (default ``polling_interval``; a backend whose reads are cheap checks more often,
    so that a failure ends the wait at once), and ``callbacks`` get it every ``polling_interval`` seconds, as in
    the Kubeflow SDK: at the first read, then at most once per interval, and once more with the job the wait
    ends on.
    """
    wanted = check_wanted_statuses(status)
    check_every = polling_interval if check_interval is None else min(check_interval, polling_interval)
    if timeout <= 0 or check_every <= 0:
        raise ValidationError("timeout", f"timeout and polling_interval must be > 0, got {timeout}, {polling_interval}")
    deadline = time.monotonic() + timeout
    called_back: float | None = None
    while True:
        job = get_job(name)
        now = time.monotonic()
        settled = job.status in wanted or job.status in types.TERMINAL_STATUSES or now >= deadline
        if callbacks and (settled or called_back is None or now - called_back >= polling_interval - 1e-3):
            called_back = now
            for callback in callbacks:
                callback(job)
        if job.status in wanted:
            return job
        if job.status == types.FAILED:
            raise JobFailedError(f"TrainJob {name} failed: {job.reason or 'Failed'}: {job.message or ''}".rstrip(": "))
        if job.status == types.COMPLETE:
            raise JobFailedError(f"TrainJob {name} completed, so it can never reach {', '.join(sorted(wanted))}")
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"TrainJob {name} is {job.status}, not {' or '.join(sorted(wanted))}, after {timeout:g} s"
            )
        time.sleep(min(check_every, left))
