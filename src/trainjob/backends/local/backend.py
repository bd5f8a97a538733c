"""The local backend: TrainJobs run as real multi-node torchrun process groups on this machine.

Each job gets a detached supervisor (:mod:`trainjob.backends.local.supervisor`) that outlives the command that
created it; state lives in SQLite under ``$TRAINJOB_HOME`` (:mod:`trainjob.backends.local.store`). A reader that
finds an active job without a live supervisor starts a replacement that adopts its running nodes (the nodes'
keepers usually have done so already); only when replacements keep dying
(:data:`MAX_SUPERVISOR_REPLACEMENTS` in a row) is the job failed with ``SupervisorLost``. Readers skip jobs
deleted while they read, and one backend may be shared by threads::

    backend = LocalBackend()
    backend.apply(TrainJob.from_dict(job_dict))
    backend.wait_for_job_status("mnist", {"Complete"}, timeout=600)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainjob import types
from trainjob.backends.base import wait_for_status
from trainjob.backends.local import processes, views
from trainjob.backends.local.logs import read_logs
from trainjob.backends.local.store import ACTIVE_STATUSES, Store, check_job_name
from trainjob.errors import NotFoundError, ValidationError

if TYPE_CHECKING:
    from trainjob.api import Runtime as RuntimeResource
    from trainjob.api import TrainJob as TrainJobResource

#: How often local waits look at the store; reading SQLite is cheap, so failures are seen at once.
LOCAL_POLL_SECONDS = 0.2
#: How long a deleted job's supervisor gets to stop its nodes (its keepers' grace included).
SUPERVISOR_STOP_SECONDS = 10.0
KEEPER_STOP_SECONDS = 6.0
#: A reader starts a replacement supervisor at most this often per job ...
SUPERVISOR_RETRY_SECONDS = 10.0
#: ... and gives the job up after this many replacements that died before they took over.
MAX_SUPERVISOR_REPLACEMENTS = 5


@dataclass
class LocalProcessBackendConfig:
    """Where local jobs keep their state: ``home`` defaults to ``$TRAINJOB_HOME``, then ``~/.trainjob``.

    ``cleanup_venv`` is accepted for compatibility with the Kubeflow SDK; a job's environment is removed with
    the job (``delete_job``).
    """

    home: str | Path | None = None
    cleanup_venv: bool = True


class LocalBackend:
    """Runs jobs as processes on this machine; every method reads and writes the shared store."""

    def __init__(self, config: LocalProcessBackendConfig | None = None) -> None:
        self.config = config or LocalProcessBackendConfig()
        self.store = Store.open(self.config.home)

    # creating jobs

    def apply(self, trainjob: TrainJobResource, runtimes: Sequence[RuntimeResource] = ()) -> types.TrainJob:
        """Create and start ``trainjob``; nothing is created when it is invalid or its name is taken."""
        self._submit(trainjob, runtimes)
        return self.get_job(trainjob.name)

    def train(
        self,
        runtime: types.Runtime | str | None = None,
        initializer: Any | None = None,
        trainer: types.CustomTrainer | None = None,
    ) -> str:
        """Run ``trainer.func`` on every rank of a new job; returns the generated job name."""
        from trainjob.api import TrainJob
        from trainjob.backends.local.function import SCRIPT_NAME, function_script, function_trainjob
        from trainjob.runtime import DEFAULT_RUNTIME
        from trainjob.trainer_checks import check_index_urls, check_requirements

        if initializer is not None:
            raise ValidationError("initializer", "dataset and model initializers are not run by the local backend")
        if not isinstance(trainer, types.CustomTrainer):
            raise ValidationError("trainer", f"the local backend runs a CustomTrainer, got {trainer!r}")
        runtime_name = runtime.name if isinstance(runtime, types.Runtime) else (runtime or DEFAULT_RUNTIME)
        name = "j" + uuid.uuid4().hex[:11]
        script = function_script(trainer.func, trainer.func_args)
        packages = check_requirements(trainer.packages_to_install)  # again: the fields may have changed since
        pip_index_urls = check_index_urls(trainer.pip_index_urls)
        script_path = self.store.job_dir(name) / SCRIPT_NAME
        resource = TrainJob.from_dict(function_trainjob(name, trainer, runtime_name, str(script_path)))
        self._submit(resource, (), packages=packages, pip_index_urls=pip_index_urls, files={SCRIPT_NAME: script})
        return name

    def _submit(
        self,
        trainjob: TrainJobResource,
        runtimes: Sequence[RuntimeResource],
        packages: list[str] | None = None,
        pip_index_urls: list[str] | None = None,
        files: dict[str, str] | None = None,
    ) -> None:
        from trainjob.backends.local.launcher import build_launch_spec
        from trainjob.runtime import find_runtime, resolve

        name = check_job_name(trainjob.name)
        job_dir = self.store.job_dir(name)
        runtime = find_runtime(trainjob.spec.runtime_ref, runtimes, namespace=trainjob.namespace)
        plan = resolve(trainjob, runtime)
        spec = build_launch_spec(plan, job_dir, os.getcwd(), packages, pip_index_urls)
        now = time.time()
        resource = trainjob.to_dict()
        resource.pop("status", None)
        uid = str(uuid.uuid4())
        resource["metadata"].update(uid=uid, creationTimestamp=views.rfc3339(now))
        status = types.SUSPENDED if plan.suspend else types.CREATED
        self.store.insert_job({
            "name": name, "namespace": trainjob.namespace, "uid": uid, "status": status,
            "reason": "Suspended" if plan.suspend else "Created", "message": None, "runtime": runtime.name,
            "num_nodes": plan.num_nodes, "num_proc_per_node": plan.num_proc_per_node, "created": now,
            "resource": resource, "launch": spec.to_dict(),
        })
        try:
            shutil.rmtree(job_dir, ignore_errors=True)  # leftovers of a job of the same name
            (job_dir / "logs").mkdir(parents=True)
            for file_name, text in (files or {}).items():
                (job_dir / file_name).write_text(text, encoding="utf-8")
            self.store.add_event(name, "Created", f"{plan.num_nodes} node(s) x {plan.num_proc_per_node} process(es) "
                                 f"on runtime {runtime.name}")
            for reason, message in spec.notes:
                self.store.add_event(name, reason, message)
            if not plan.suspend:
                self._start_supervisor(name)
        except BaseException:
            self.store.delete_job(name)
            shutil.rmtree(job_dir, ignore_errors=True)
            raise

    def _start_supervisor(self, name: str, replacing: bool = False) -> None:
        """Start the job's supervisor; a replacement records itself once it holds the supervisor lock."""
        job_dir = self.store.job_dir(name)
        env = {**os.environ, processes.JOB_DIR_ENV: str(job_dir)}
        argv = [sys.executable, "-m", "trainjob.backends.local.supervisor", str(self.store.home), name]
        with (job_dir / "supervisor.log").open("ab") as log:
            process = subprocess.Popen(
                argv + (["--replace"] if replacing else []),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, close_fds=True,
            )
        if not replacing:
            self.store.update_job(name, supervisor_pid=process.pid, supervisor_started=processes.start_time(process.pid))

    # reading jobs

    def list_jobs(self, runtime: types.Runtime | None = None) -> list[types.TrainJob]:
        """Every job, oldest first (only those on ``runtime`` when given); steps are left empty."""
        rows = self._checked(self.store.list_jobs())
        if runtime is not None:
            rows = [row for row in rows if row["runtime"] == runtime.name]
        return [views.sdk_job(row) for row in rows]

    def list_summaries(self) -> list[tuple[Any, ...]]:
        """One tuple per job (:data:`~trainjob.backends.local.store.SUMMARY_COLUMNS`), supervisors checked.

        The fast path of ``trainjob list``: no per-job objects, so thousands of jobs list in milliseconds.
        """
        summaries = self.store.list_summaries()
        stale = [
            name
            for name, status, *_, pid, pid_started in summaries
            if status in ACTIVE_STATUSES and pid and not processes.is_alive(pid, pid_started)
        ]
        if stale:
            self._checked(self.store.list_jobs(stale))
            summaries = self.store.list_summaries()
        return summaries

    def get_job(self, name: str) -> types.TrainJob:
        row = self._checked_one(name)
        return views.sdk_job(row, self.store.nodes(name))

    def get_job_events(self, name: str) -> list[types.Event]:
        self.store.get_job(name)
        return [views.sdk_event(row) for row in self.store.events(name)]

    def get_job_logs(self, name: str, step: str = "node-0", follow: bool = False) -> Iterator[str]:
        """Raw lines of one step (``node-0``, ``node-1`` ...), as the pod's log would show them."""
        row = self.store.get_job(name)
        steps = [f"node-{i}" for i in range(row["num_nodes"])]
        if step not in steps:
            raise ValidationError("step", f"must be one of {', '.join(steps)}, got {step!r}")
        lines = self.logs(name, node=int(step.removeprefix("node-")), follow=follow)
        return (line.text if line.rank is None else f"[rank{line.rank}]: {line.text}" for line in lines)

    def logs(self, name: str, node: int | None = None, rank: int | None = None, follow: bool = False) -> Iterator[types.LogLine]:
        """Lines of every node (or one ``node``, or one global ``rank``); ``follow`` streams until the job ends."""
        row = self.store.get_job(name)
        nodes = list(range(row["num_nodes"]))
        if node is not None and node not in nodes:
            raise ValidationError("node", f"must be 0..{len(nodes) - 1} for TrainJob {name}, got {node}")
        world = row["num_nodes"] * row["num_proc_per_node"]
        if rank is not None and not 0 <= rank < world:
            raise ValidationError("rank", f"must be 0..{world - 1} for TrainJob {name}, got {rank}")
        if node is not None:
            nodes = [node]
        return read_logs(self.store.job_dir(name), nodes, rank=rank, follow=follow, finished=lambda: self._settled(name))

    def _settled(self, name: str) -> bool:
        """Whether the job has ended (or is gone); asked on every poll of a followed log, so reads a narrow row."""
        try:
            rows = self._checked(self.store.list_jobs([name]))
        except NotFoundError:  # deleted while its supervisor was being checked
            return True
        return not rows or rows[0]["status"] not in ACTIVE_STATUSES

    def wait_for_job_status(
        self,
        name: str,
        status: set[str] | frozenset[str] = frozenset({types.COMPLETE}),
        timeout: float = 600,
        polling_interval: float = 2,
        callbacks: Sequence[Callable[[types.TrainJob], None]] | None = None,
    ) -> types.TrainJob:
        """Wait until the job's status is in ``status``; raises ``JobFailedError`` as soon as it fails."""
        return wait_for_status(self.get_job, name, status, timeout, min(polling_interval, LOCAL_POLL_SECONDS), callbacks)

    # changing jobs

    def delete_job(self, name: str) -> None:
        """Stop every process of the job, then remove its state, logs and environment."""
        row = self.store.get_job(name)
        job_dir = self.store.job_dir(name)
        self.store.update_job(name, request="delete")  # no replacement supervisor takes the job from here on
        if processes.is_alive(row["supervisor_pid"], row["supervisor_started"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(row["supervisor_pid"], signal.SIGTERM)
            deadline = time.monotonic() + SUPERVISOR_STOP_SECONDS
            while processes.is_alive(row["supervisor_pid"], row["supervisor_started"]) and time.monotonic() < deadline:
                time.sleep(0.05)
        self._stop_job_processes(name, row)
        self.store.delete_job(name)
        shutil.rmtree(job_dir, ignore_errors=True)

    def _stop_job_processes(self, name: str, row: dict[str, Any]) -> None:
        """Stop the node keepers (each stops its node and whatever the node left behind), then sweep."""
        keepers = [(n["pid"], n["pid_started"]) for n in self.store.nodes(name)]
        for pid, started in keepers:
            if processes.is_alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + KEEPER_STOP_SECONDS
        while any(processes.is_alive(pid, started) for pid, started in keepers) and time.monotonic() < deadline:
            time.sleep(0.05)
        processes.stop_processes(processes.job_processes(str(self.store.job_dir(name)), since=row["created"]), grace=2.0)

    def suspend_job(self, name: str, timeout: float = 30) -> None:
        """Stop the job's node processes and keep the job as ``Suspended``; :meth:`resume_job` starts it again."""
        row = self._checked_one(name)
        if row["status"] == types.SUSPENDED:
            return
        if row["status"] not in ACTIVE_STATUSES:
            raise ValidationError("status", f"TrainJob {name} is {row['status']}; only Created or Running jobs can be suspended")
        self.store.update_job(name, request="suspend")
        self.wait_for_job_status(name, {types.SUSPENDED}, timeout=timeout, polling_interval=LOCAL_POLL_SECONDS)

    def resume_job(self, name: str) -> None:
        """Start a suspended job's nodes again (from the beginning: scripts resume from their checkpoints)."""
        if not self.store.transition(name, types.CREATED, "Resumed", "resumed by the user",
                                     from_statuses=(types.SUSPENDED,), request=None, finished=None):
            row = self.store.get_job(name)
            raise ValidationError("status", f"TrainJob {name} is {row['status']}; only Suspended jobs can be resumed")
        self.store.add_event(name, "Resumed", "node processes will start again")
        self._start_supervisor(name)

    # runtimes

    def list_runtimes(self) -> list[types.Runtime]:
        from trainjob.runtime import builtin_runtimes

        return [sdk_runtime_of(r) for r in builtin_runtimes().values()]

    def get_runtime(self, name: str) -> types.Runtime:
        from trainjob.runtime import find_runtime

        return sdk_runtime_of(find_runtime(name))

    # supervisor liveness

    def _checked(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``rows`` as they are once lost supervisors are being replaced; rows of jobs deleted meanwhile dropped."""
        checked = []
        for row in rows:
            if row["status"] in ACTIVE_STATUSES and not self._supervised(row):
                try:
                    self._replace_supervisor(row)
                    fresh = self.store.get_job(row["name"])
                except NotFoundError:  # deleted while we looked
                    continue
                row = {**row, **{k: v for k, v in fresh.items() if k in row}}
            checked.append(row)
        return checked

    def _checked_one(self, name: str) -> dict[str, Any]:
        for row in self._checked([self.store.get_job(name)]):
            return row
        raise NotFoundError(f"TrainJob {name!r} not found; `trainjob list` shows the jobs there are")

    def _supervised(self, row: dict[str, Any]) -> bool:
        if not row["supervisor_pid"] or processes.is_alive(row["supervisor_pid"], row["supervisor_started"]):
            return True
        with contextlib.suppress(ValidationError):
            return processes.supervisor_lock_held(self.store.job_dir(row["name"]))
        return False

    def _replace_supervisor(self, row: dict[str, Any]) -> None:
        """Start a replacement for the job's lost supervisor (at most one per :data:`SUPERVISOR_RETRY_SECONDS`),
        or fail the job when :data:`MAX_SUPERVISOR_REPLACEMENTS` in a row died before taking over."""
        name = row["name"]
        if self.store.get_job(name)["request"] == "delete":
            return
        attempt = self.store.claim_supervisor_replacement(name, row["supervisor_pid"], time.time(), SUPERVISOR_RETRY_SECONDS)
        if attempt is None:
            return
        if attempt <= MAX_SUPERVISOR_REPLACEMENTS:
            self._start_supervisor(name, replacing=True)
            return
        message = (f"the job's supervisor (pid {row['supervisor_pid']}) was lost and {MAX_SUPERVISOR_REPLACEMENTS} "
                   "replacements died before taking over; its node processes were stopped")
        if self.store.transition(name, types.FAILED, "SupervisorLost", message,
                                 from_statuses=ACTIVE_STATUSES, finished=time.time()):
            self.store.add_event(name, "SupervisorLost", message, type="Warning")
            self._stop_job_processes(name, self.store.get_job(name))


def sdk_runtime_of(runtime: RuntimeResource) -> types.Runtime:
    """The SDK view of a runtime resource: framework label, trainer image, default node count."""
    data = runtime.to_dict()
    spec = data.get("spec", {})
    jobs = spec.get("template", {}).get("spec", {}).get("replicatedJobs", [])
    image = ""
    for job in jobs:
        for container in job.get("template", {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            if container.get("name") == "node":
                image = container.get("image", "")
    ml_policy = spec.get("mlPolicy") or {}
    trainer = types.RuntimeTrainer(
        trainer_type="CustomTrainer",
        framework=data.get("metadata", {}).get("labels", {}).get("trainer.kubeflow.org/framework", "torch"),
        image=image,
        num_nodes=ml_policy.get("numNodes", 1),
        device_count=str((ml_policy.get("torch") or {}).get("numProcPerNode", types.UNKNOWN)),
    )
    return types.Runtime(name=runtime.name, trainer=trainer)


__all__ = ["LocalBackend", "LocalProcessBackendConfig"]
