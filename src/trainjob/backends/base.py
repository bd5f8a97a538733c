"""What every backend (local processes, Kubernetes) offers; ``TrainerClient`` and the CLI only talk to this.

Method names follow the Kubeflow SDK (``train``, ``list_jobs``, ``get_job_logs`` ...); ``apply``, ``logs``,
``suspend_job`` and ``resume_job`` are this project's additions. A backend raises errors from
:mod:`trainjob.errors`: ``NotFoundError`` for unknown jobs or runtimes, ``AlreadyExistsError`` for a taken name,
``ValidationError`` for bad input, ``JobFailedError`` when a waited-for job fails, ``TimeoutError`` on timeouts.

Every backend derives from :class:`Backend`, which holds what they share (trainers to TrainJobs, step and rank
to node, waiting, summaries); waiting on any ``get_job`` is :func:`wait_for_status`::

    job = wait_for_status(backend.get_job, "mnist", {"Complete"}, timeout=600, polling_interval=2)

``train`` takes the Kubeflow SDK's trainers (``CustomTrainer``, ``CustomTrainerContainer``) and ``options``
(:mod:`trainjob.sdk.options`); ``get_runtime_packages`` prints what a runtime's trainer runs with.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainjob.backends.log_selection import select_nodes
from trainjob.constants import (
    DISRUPTIONS_ANNOTATION,
    FRAMEWORK_LABEL,
    RESTARTS_REPORTED_ANNOTATION,
    STALL_RESTARTS_ANNOTATION,
    TORCHTUNE_FRAMEWORK,
    TRAINER_CONTAINER,
    TRAINER_JOB,
)
from trainjob.errors import BackendError, JobFailedError, ValidationError
from trainjob.sdk import types

if TYPE_CHECKING:
    from trainjob.api import Runtime as RuntimeResource
    from trainjob.api import TrainJob as TrainJobResource
    from trainjob.backends.stacks import RankStacks
    from trainjob.runtime.launch import LaunchValues
    from trainjob.runtime.plan import Plan
    from trainjob.sdk.builtin_trainers import BuiltinTrainer
    from trainjob.sdk.trainers import TrainerFunction


@dataclass(frozen=True)
class CheckedJob:
    """A TrainJob resolved against its runtime by the backend that will create it (:meth:`Backend.check`).

    Handed back to :meth:`Backend.apply` (``checked=``) it is created as it was checked, without resolving it
    again; ``apply --dry-run`` prints :meth:`summary`."""

    trainjob: TrainJobResource
    plan: Plan
    #: The runtime it was resolved against (its annotations hold defaults for its jobs), when the backend kept it.
    runtime: RuntimeResource | None = None

    @property
    def launch(self) -> LaunchValues:
        """The launch values the backend stores with the job."""
        from trainjob.runtime.launch import resolve_launch_values

        return resolve_launch_values(self.plan)

    def summary(self) -> str:
        """``2 node(s) x 4 process(es) on runtime torch-distributed; command: torchrun train.py``."""
        container = self.plan.trainer().container()
        command = " ".join([*container.command, *container.args]) or "<the image's entrypoint>"
        return (f"{self.plan.num_nodes} node(s) x {self.plan.num_proc_per_node} process(es) on runtime "
                f"{self.plan.runtime_name}; command: {command}")


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


def restarts_by_reason(annotations: Mapping[str, str] | None) -> dict[str, int]:
    """How many times a job's node group restarted on the cluster, by why, from the operator's annotations on the
    TrainJob: ``failure`` (the JobSet's restarts, against its ``maxRestarts``), ``stall`` (the stall watch's, against
    the same budget), ``disruption`` (a pod evicted, preempted or lost: not counted against it)."""

    def count(key: str) -> int:
        value = str((annotations or {}).get(key) or "0")
        return int(value) if value.isdigit() else 0

    return {"failure": count(RESTARTS_REPORTED_ANNOTATION), "stall": count(STALL_RESTARTS_ANNOTATION),
            "disruption": count(DISRUPTIONS_ANNOTATION)}


def runtime_view(runtime: Mapping[str, Any]) -> types.Runtime:
    """A (Cluster)TrainingRuntime (as a dict in API shape) as the SDK's ``Runtime``: its framework (the
    ``trainer.kubeflow.org/framework`` label, else the ``mlPolicy`` it has), the trainer's image and command, the
    default node count and processes per node (``device_count``, as the runtime says: ``auto`` stays ``auto``)."""
    meta, spec = runtime.get("metadata") or {}, runtime.get("spec") or {}
    ml = spec.get("mlPolicy") or {}
    framework = (meta.get("labels") or {}).get(FRAMEWORK_LABEL) or next(
        (key for key in ("torch", "mpi") if key in ml), "plainml")
    image, command = types.UNKNOWN, ()
    for job in ((spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []:
        if job.get("name") != TRAINER_JOB:
            continue
        containers = (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get(
            "containers") or []
        container = next((c for c in containers if c.get("name") == TRAINER_CONTAINER), containers[0] if containers
                         else None)
        if container is not None:
            image, command = container.get("image", types.UNKNOWN), tuple(container.get("command") or ())
    nproc = next(((ml.get(key) or {}).get("numProcPerNode") for key in ("torch", "mpi") if key in ml), None)
    trainer = types.RuntimeTrainer(
        trainer_type="BuiltinTrainer" if framework == TORCHTUNE_FRAMEWORK else "CustomTrainer",
        framework=framework,
        image=image,
        num_nodes=int(ml.get("numNodes") or 1),
        device_count=types.UNKNOWN if nproc is None else str(nproc),
        command=command,
    )
    return types.Runtime(name=meta.get("name", types.UNKNOWN), trainer=trainer)


class Backend(ABC):
    """Runs TrainJobs somewhere and reports on them: the contract of every backend, and what they share.

    A backend implements creating (:meth:`check`, :meth:`apply`, :meth:`_create_trainjob` for what a trainer's
    function needs), reading (:meth:`get_job`, :meth:`list_jobs`, :meth:`get_job_events`, :meth:`_launch_shape`,
    :meth:`_read_logs`), changing (:meth:`delete_job`, :meth:`suspend_job`, :meth:`resume_job`) and its runtimes.
    This class turns SDK trainers into TrainJobs (every ``CustomTrainer`` checked the same way:
    :func:`trainjob.sdk.trainers.trainer_function`), maps steps and ranks to nodes, waits for statuses and summarizes
    jobs, the same on every backend.
    """

    #: The backend's name, as ``--backend`` and the config file's ``backend:`` name it.
    backend_name = ""
    #: First letter of generated job names (a DNS label starts with a letter).
    job_name_prefix = "j"
    #: How often :meth:`wait_for_job_status` reads the job (``None``: every ``polling_interval``).
    check_interval: float | None = None
    #: Where :meth:`train` puts its jobs (``None``: where the backend keeps them).
    namespace: str | None = None
    #: Whether :meth:`train` needs a trainer (else a job made of the runtime and the options alone).
    trainer_required = True

    # -- creating ---------------------------------------------------------------------------------------------------

    @abstractmethod
    def check(self, trainjob: TrainJobResource, runtimes: Sequence[RuntimeResource] = ()) -> CheckedJob:
        """Resolve ``trainjob`` as :meth:`apply` would and check what can be checked before creating anything;
        ``ValidationError`` / ``NotFoundError`` as ``apply`` raises them. Creates nothing."""

    @abstractmethod
    def apply(
        self, trainjob: TrainJobResource, runtimes: Sequence[RuntimeResource] = (), *, checked: CheckedJob | None = None
    ) -> types.TrainJob:
        """Create ``trainjob``; its runtime is found among ``runtimes`` first (``checked``: what :meth:`check`
        returned for it, so that it is not resolved again)."""

    @abstractmethod
    def _create_trainjob(self, job: dict[str, Any], function: TrainerFunction | None) -> str:
        """Create the TrainJob ``job`` (a dict) made for an SDK trainer, shipping ``function`` (a
        ``CustomTrainer``'s) to its nodes; the job's name."""

    def train(
        self,
        runtime: types.Runtime | str | None = None,
        initializer: Any | None = None,
        trainer: types.CustomTrainer | types.CustomTrainerContainer | BuiltinTrainer | None = None,
        options: Sequence[Any] | None = None,
    ) -> str:
        """Create a job that runs ``trainer`` (``options`` from :mod:`trainjob.sdk.options`) on ``runtime``; its name.

        A ``CustomTrainer``'s function runs under torchrun on every node: it is checked here (a ``def`` whose
        source is available, the names it uses, ``func_args`` that bind to its signature and are JSON, the
        packages and index URLs) before anything is created. A ``CustomTrainerContainer`` runs its command; a
        ``BuiltinTrainer`` runs torchtune and needs a torchtune runtime."""
        from trainjob.runtime.catalog import DEFAULT_RUNTIME
        from trainjob.sdk.builtin_trainers import BuiltinTrainer
        from trainjob.sdk.initializers import initializer_spec
        from trainjob.sdk.trainers import check_builtin_runtime, check_trainer, sdk_trainjob, trainer_function

        if trainer is not None or self.trainer_required:
            trainer = check_trainer(trainer)
        runtime_name = runtime.name if isinstance(runtime, types.Runtime) else (runtime or DEFAULT_RUNTIME)
        if isinstance(trainer, BuiltinTrainer):
            check_builtin_runtime(runtime if isinstance(runtime, types.Runtime) else self.get_runtime(runtime_name))
        name = f"{self.job_name_prefix}{uuid.uuid4().hex[:11]}"
        job = sdk_trainjob(trainer, runtime_name, name, options, self, namespace=self.namespace,
                           initializer=initializer_spec(initializer), source_initializer=initializer)
        function = trainer_function(trainer) if isinstance(trainer, types.CustomTrainer) else None
        return self._create_trainjob(job, function)

    @abstractmethod
    def get_runtime_packages(self, runtime: types.Runtime | str) -> None:
        """Print the Python version, the installed packages and the GPUs a job on ``runtime`` runs with."""

    # -- reading ----------------------------------------------------------------------------------------------------

    @abstractmethod
    def get_job(self, name: str) -> types.TrainJob:
        """The job; ``NotFoundError`` when there is none."""

    @abstractmethod
    def list_jobs(self, runtime: types.Runtime | None = None) -> list[types.TrainJob]:
        """Every job, oldest first (only those on ``runtime`` when given)."""

    def list_summaries(self) -> list[types.JobSummary]:
        """One summary per job, oldest first: what ``trainjob list`` and the dashboard's list show (a backend with
        a faster way than :meth:`list_jobs` overrides it)."""
        return [types.JobSummary.of(job) for job in self.list_jobs()]

    @abstractmethod
    def get_job_events(self, name: str) -> list[types.Event]:
        """The job's events, oldest first."""

    def get_job_stacks(self, name: str) -> list[RankStacks]:
        """Every running rank's Python stacks, in rank order (``trainjob stacks NAME``); a backend that cannot
        read them raises ``BackendError``. :func:`trainjob.backends.stacks.find_stuck_ranks` reads them::

            print(find_stuck_ranks(backend.get_job_stacks("mnist")).summary)
        """
        raise BackendError(f"the {type(self).__name__} cannot read a job's stacks; `trainjob logs {name}` shows "
                           "what its ranks printed")

    @abstractmethod
    def list_runtimes(self) -> list[types.Runtime]: ...

    @abstractmethod
    def get_runtime(self, name: str) -> types.Runtime: ...

    def wait_for_job_status(
        self,
        name: str,
        status: set[str] | frozenset[str] = frozenset({types.COMPLETE}),
        timeout: float = 600,
        polling_interval: float = 2,
        callbacks: Sequence[Callable[[types.TrainJob], None]] | None = None,
    ) -> types.TrainJob:
        """Wait until the job's status is in ``status`` (:func:`wait_for_status`); raises ``JobFailedError`` as
        soon as it fails."""
        return wait_for_status(self.get_job, name, status, timeout, polling_interval, callbacks,
                               check_interval=self.check_interval)

    # -- logs -------------------------------------------------------------------------------------------------------

    def get_job_logs(self, name: str, step: str = "node-0", follow: bool = False) -> Iterator[str]:
        """Lines of one step's node (``node-0``, ``node-1`` ...), as the Kubeflow SDK names them, prefixed as
        ``trainjob logs`` prints them (``node-0/rank-1 | loss 0.41``, :class:`~trainjob.sdk.types.LogLine`); a step
        the job does not have is a ``ValidationError`` naming the steps it has."""
        num_nodes, _ = self._launch_shape(name)
        return map(str, self.logs(name, node=step_node(name, step, num_nodes), follow=follow))

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
        until: Callable[[], bool] | None = None,
    ) -> Iterator[types.LogLine]:
        """Lines of every node (or one ``node``, or the node of one global ``rank``), merged by the time they were
        written: only those since ``since`` (Unix time), the last ``tail``, of the attempt before the last restart
        (``previous``); ``stop_output`` adds the lines that say why a node stopped where the backend writes them;
        a followed log ends when the job does, or sooner when ``until`` (asked between reads, where the backend
        polls files) says so. A ``node``/``rank`` pair that names no process is a ``ValidationError``
        (:func:`~trainjob.backends.log_selection.select_nodes`)."""
        num_nodes, num_proc_per_node = self._launch_shape(name)
        nodes = select_nodes(name, num_nodes, num_proc_per_node, node, rank)
        return self._read_logs(name, nodes, LogRequest(rank, follow, since, tail, previous, stop_output, until))

    @abstractmethod
    def _launch_shape(self, name: str) -> tuple[int, int | None]:
        """The job's nodes and processes per node as it was launched (``None`` while not known); ``NotFoundError``
        for an unknown job."""

    @abstractmethod
    def _read_logs(self, name: str, nodes: list[int], request: LogRequest) -> Iterator[types.LogLine]:
        """The lines of ``nodes`` that ``request`` asks for (:meth:`logs` chose the nodes)."""

    # -- changing ---------------------------------------------------------------------------------------------------

    @abstractmethod
    def delete_job(self, name: str) -> None: ...

    @abstractmethod
    def suspend_job(self, name: str) -> None: ...

    @abstractmethod
    def resume_job(self, name: str) -> None: ...

    @abstractmethod
    def expired_jobs(self, now: float) -> list[str]:
        """The finished jobs whose ``trainjob/ttl-seconds-after-finished`` has run out at ``now`` (Unix time)."""

    def housekeeping(self) -> None:
        """What a controller does between commands (remove expired jobs, admit queued ones); nothing where a
        controller runs (the Kubernetes operator)."""
        return None

    def metric_records(self, name: str, after: float = 0) -> list[dict[str, Any]]:
        """The job's metric records newer than ``after`` (an ``id`` of an earlier record), oldest first, each
        ``{"id", "time", "step", "metrics"}``. Here: the job's reported progress, one record per change (its time
        is its id); a backend that keeps every report gives them all."""
        progress = self.get_job(name).progress
        if progress is None or progress.updated is None or progress.updated.timestamp() <= after:
            return []
        stamp = progress.updated.timestamp()
        return [{"id": stamp, "time": stamp, "step": progress.step, "metrics": dict(progress.metrics)}]

    def node_processes(self, name: str) -> dict[int, NodeProcess] | None:
        """The process each node of the job runs, by node index, where nodes are processes here (``None``: they
        are pods, see the job's steps)."""
        return None


@dataclass(frozen=True)
class LogRequest:
    """What :meth:`Backend.logs` asks a backend to read of the nodes it chose."""

    rank: int | None = None
    follow: bool = False
    since: float | None = None
    tail: int | None = None
    previous: bool = False
    stop_output: bool = False
    #: Asked between reads of a followed log: ``True`` ends it before the job does.
    until: Callable[[], bool] | None = None


@dataclass(frozen=True)
class NodeProcess:
    """A node that is a process on this machine: its status, pid and exit code (``None`` while unknown)."""

    status: str
    pid: int | None = None
    exit_code: int | None = None


def step_node(name: str, step: str, num_nodes: int) -> int:
    """The node of step ``node-N`` of a job with ``num_nodes`` nodes; ``ValidationError`` naming the steps.

    >>> step_node("mnist", "node-1", 2)
    1
    """
    steps = [f"node-{index}" for index in range(num_nodes)]
    if step not in steps:
        raise ValidationError("step", f"must be one of {', '.join(steps)} for TrainJob {name}, got {step!r}")
    return steps.index(step)
