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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainjob.backends.base import Backend, CheckedJob, LogRequest, NodeProcess, runtime_view
from trainjob.backends.local import processes
from trainjob.backends.local.client import views
from trainjob.backends.local.client.ttl import expired_jobs
from trainjob.backends.local.store import ACTIVE_STATUSES, UNFINISHED_STATUSES, Store, check_job_name
from trainjob.backends.local.supervisor.start import start_supervisor
from trainjob.backends.stall import checked_stall_policy
from trainjob.backends.ttl import ttl_seconds
from trainjob.errors import BackendError, NotFoundError, ValidationError
from trainjob.sdk import types

# Creating a job needs the runtime framework, the queue, volumes and process specs; reading jobs (``list``,
# ``get``, the dashboard) needs none of them, so they are imported where a job is created, queued or removed.
if TYPE_CHECKING:
    from trainjob.api import Runtime as RuntimeResource
    from trainjob.api import TrainJob as TrainJobResource
    from trainjob.backends.local import volumes
    from trainjob.backends.local.client.scaling import Scaling
    from trainjob.backends.local.containers import ContainerSpec
    from trainjob.backends.local.process_specs import ProcessSpec
    from trainjob.backends.local.queue import Request
    from trainjob.backends.stacks import RankStacks
    from trainjob.runtime.plan import Plan
    from trainjob.sdk.trainers import TrainerFunction

#: How often local waits look at the store; reading SQLite is cheap, so failures are seen at once.
LOCAL_POLL_SECONDS = 0.2
#: How long a deleted job's supervisor gets to stop its nodes (its keepers' grace included).
SUPERVISOR_STOP_SECONDS = 10.0
#: A reader starts a replacement supervisor at most this often per job ...
SUPERVISOR_RETRY_SECONDS = 10.0
#: ... and gives the job up after this many replacements that died before they took over.
MAX_SUPERVISOR_REPLACEMENTS = 5
#: The largest count the store keeps (SQLite's INTEGER).
MAX_COUNT = 2**63 - 1


@dataclass
class LocalProcessBackendConfig:
    """Where local jobs keep their state: ``home`` defaults to ``$TRAINJOB_HOME``, then ``~/.trainjob``.

    Nodes get what a pod would of the environment a job is created from (a ``PATH``, ``HOME``, locale, this
    Python environment: :data:`~trainjob.backends.local.process_specs.PASSED_ENV`), not an exported ``NCCL_DEBUG``;
    ``inherit_env=True`` passes them everything (an ``EnvironmentInherited`` event names what).
    ``cleanup_venv`` is accepted for compatibility with the Kubeflow SDK: a ``CustomTrainer``'s
    ``packages_to_install`` go into an environment cached under ``<home>/envs`` and shared by every job that
    installs the same packages (:mod:`~trainjob.backends.local.supervisor.environment`), kept until removed.

    ``strict_resources`` (default: ``$TRAINJOB_STRICT_RESOURCES``, then the config file's ``strict_resources``)
    refuses a job bigger than this machine at submit instead of running it alone, scaled to the machine
    (:mod:`~trainjob.backends.local.client.scaling`).

    Pod-template volumes (:mod:`~trainjob.backends.local.volumes`): claims live under ``volumes_root`` (default
    ``$TRAINJOB_VOLUMES_ROOT``, else ``<home>/volumes``), ``config_maps`` maps configMap names to local files or
    directories, and ``mount_mechanism`` (``auto``, ``namespace``, ``env``; default ``$TRAINJOB_MOUNT_MECHANISM``,
    else ``auto``) says how the processes see them at their ``mountPath``.
    """

    home: str | Path | None = None
    cleanup_venv: bool = True
    inherit_env: bool = False
    volumes_root: str | Path | None = None
    config_maps: dict[str, str | Path] = field(default_factory=dict)
    mount_mechanism: str | None = None
    strict_resources: bool | None = None
    #: Run each node as a container of the job's image (:mod:`~trainjob.backends.local.containers`), with
    #: ``container_runtime`` (``docker`` or ``podman``; default: the one found) and ``pull_policy``.
    containers: bool = False
    container_runtime: str | None = None
    pull_policy: str = "IfNotPresent"
    #: Containers are removed when their node ends (``False``: kept until the job is deleted, to inspect them).
    auto_remove: bool = True


@dataclass
class ContainerBackendConfig:
    """The Kubeflow SDK's ``ContainerBackendConfig``: jobs on this machine with every node a container of the job's
    image, on Docker or Podman (``container_runtime``; default: Docker where its daemon answers, else Podman)::

        client = TrainerClient(ContainerBackendConfig(container_runtime="podman"))
        client.train(trainer=CustomTrainer(func=train, num_nodes=2, image="localhost/my-train:1"))

    Everything else is the local backend's (:class:`LocalProcessBackendConfig`); ``container_host`` (a remote
    daemon) is not supported: the nodes' job directories are bind-mounted from this machine."""

    pull_policy: str = "IfNotPresent"
    auto_remove: bool = True
    container_host: str | None = None
    container_runtime: str | None = None
    home: str | Path | None = None


def local_config(config: Any | None) -> LocalProcessBackendConfig:
    """The local backend's config for ``config``: itself, or a ``ContainerBackendConfig`` (trainjob's or the
    Kubeflow SDK's, read by its field names) as the container mode of the local backend."""
    if config is None or isinstance(config, LocalProcessBackendConfig):
        return config or LocalProcessBackendConfig()
    if getattr(config, "container_host", None):
        raise ValidationError("container_host", f"containers run on this machine's engine (the job's directory is "
                              f"bind-mounted into them), got {config.container_host!r}; leave it unset")
    return LocalProcessBackendConfig(home=getattr(config, "home", None), containers=True,
                                     container_runtime=getattr(config, "container_runtime", None),
                                     pull_policy=getattr(config, "pull_policy", None) or "IfNotPresent",
                                     auto_remove=bool(getattr(config, "auto_remove", True)))


class LocalBackend(Backend):
    """Runs jobs as processes on this machine; every method reads and writes the shared store."""

    backend_name = "local"
    check_interval = LOCAL_POLL_SECONDS

    def __init__(self, config: LocalProcessBackendConfig | ContainerBackendConfig | None = None) -> None:
        self.config = local_config(config)
        self.store = Store.open(self.config.home)
        self._supervisors = processes.Watched()

    # creating jobs

    def check(self, trainjob: TrainJobResource, runtimes: Sequence[RuntimeResource] = (),
              containers: bool | None = None) -> CheckedJob:
        """``trainjob`` resolved against its runtime (among ``runtimes``, then the built-ins), its name, TTL and,
        unless it mounts volumes (checked when it is created) or runs in containers (``containers``, default: the
        config's; the script is the image's), the script its command runs checked here."""
        from trainjob.backends.local.client.commands import check_command_files
        from trainjob.runtime import find_runtime, resolve

        name = check_job_name(trainjob.name)
        ttl_seconds(trainjob.metadata.annotations)
        runtime = find_runtime(trainjob.spec.runtime_ref, runtimes, namespace=trainjob.namespace)
        plan = resolve(trainjob, runtime)
        checked = CheckedJob(trainjob, plan, runtime)
        checked_stall_policy(checked)  # a bad stall annotation: nothing is created
        container = plan.trainer().container()
        if not container.volume_mounts and not self._containers(containers):
            try:
                check_command_files([*container.command, *container.args], container.working_dir or os.getcwd(),
                                    provided=self.store.job_dir(name))
            except ValidationError as exc:
                raise ValidationError(f"TrainJob {name}: {exc.path}", exc.message) from None
        return checked

    def apply(
        self, trainjob: TrainJobResource, runtimes: Sequence[RuntimeResource] = (), *, checked: CheckedJob | None = None,
        inherit_env: bool | None = None, config_maps: Mapping[str, str | Path] | None = None,
        containers: bool | None = None,
    ) -> types.TrainJob:
        """Create and start ``trainjob``; nothing is created when it is invalid or its name is taken.

        ``checked``: what :meth:`check` returned for it (not resolved again). ``inherit_env`` (default: the
        config's) passes the nodes this whole environment, not only what a pod would get; ``config_maps`` (NAME:
        file or directory) are added to the config's for this job; ``containers`` (default: the config's) runs
        its nodes as containers of its image."""
        checked = checked or self.check(trainjob, runtimes, containers=containers)
        self._submit(checked, inherit_env=inherit_env, config_maps=config_maps, containers=containers)
        return self.get_job(trainjob.name)

    def _containers(self, containers: bool | None) -> bool:
        return self.config.containers if containers is None else containers

    def _container_engine(self, containers: bool | None) -> ContainerSpec | None:
        """The engine a job's nodes run with, found and checked now (``None``: they run as processes)."""
        if not self._containers(containers):
            return None
        from trainjob.backends.local.containers import ContainerSpec, find_engine

        engine = find_engine(self.config.container_runtime)
        return ContainerSpec(engine=engine.name, engine_path=engine.path, image="", keep=not self.config.auto_remove)

    def _create_trainjob(self, job: dict[str, Any], function: TrainerFunction | None) -> str:
        """Create ``job``; a ``CustomTrainer``'s function is written next to the job and run with torchrun
        (a ``CustomTrainerContainer`` runs its command: the ``TrainerCommand`` option; images are not run here)."""
        from trainjob.api import TrainJob
        from trainjob.sdk.function_script import SCRIPT_NAME

        name = check_job_name(job["metadata"].get("name"))
        if function is None:
            self._submit(self.check(TrainJob.from_dict(job)))
            return name
        command = ["torchrun", str(self.store.job_dir(name) / SCRIPT_NAME)]
        packages = function.packages
        if self.config.containers and packages:  # installed in each container, as the Kubeflow SDK's backend does
            from trainjob.backends.local.containers import install_first

            command, packages = install_first(command, packages, function.pip_index_urls), []
        job["spec"]["trainer"]["command"] = command
        self._submit(self.check(TrainJob.from_dict(job)), packages=packages,
                     pip_index_urls=function.pip_index_urls, files={SCRIPT_NAME: function.script})
        return name

    def get_runtime_packages(self, runtime: types.Runtime | str) -> None:
        """Print what a job on ``runtime`` runs with here: the Python version, ``pip list`` of this environment
        and, where there are GPUs, ``nvidia-smi`` (as the Kubeflow SDK prints them for a runtime's image)."""
        from trainjob.runtime import find_runtime

        find_runtime(runtime.name if isinstance(runtime, types.Runtime) else runtime)  # NotFoundError naming the known
        print(f"Python: {sys.version}", flush=True)
        listed = subprocess.run([sys.executable, "-m", "pip", "list", "--disable-pip-version-check"],
                                capture_output=True, text=True)
        print((listed.stdout or listed.stderr or "pip not found").rstrip(), flush=True)
        if shutil.which("nvidia-smi"):
            gpus = subprocess.run(["nvidia-smi"], capture_output=True, text=True)
            print((gpus.stdout or gpus.stderr).rstrip(), flush=True)

    def _submit(
        self,
        checked: CheckedJob,
        packages: list[str] | None = None,
        pip_index_urls: list[str] | None = None,
        files: dict[str, str] | None = None,
        inherit_env: bool | None = None,
        config_maps: Mapping[str, str | Path] | None = None,
        containers: bool | None = None,
    ) -> None:
        from trainjob.backends.local import queue, volumes
        from trainjob.backends.local.client import scaling
        from trainjob.backends.local.client.commands import check_command_files
        from trainjob.backends.local.process_specs import build_process_spec
        from trainjob.runtime.submit_events import submit_events

        trainjob, plan, launch = checked.trainjob, checked.plan, checked.launch
        name = trainjob.name
        job_dir = self.store.job_dir(name)
        inherit = self.config.inherit_env if inherit_env is None else inherit_env
        engine = self._container_engine(containers)
        spec = build_process_spec(plan, job_dir, os.getcwd(), packages, pip_index_urls, inherit_env=inherit,
                                  containers=engine)
        spec.stall = checked_stall_policy(checked)
        host_volumes = self._resolve_host_volumes(plan, job_dir, spec, config_maps)
        if spec.steps:
            from trainjob.backends.local.initializer_steps import place_steps
            from trainjob.initializers.cache import data_cache_dir

            place_steps(spec.steps, host_volumes, data_cache_dir(self.store.home, os.environ), os.environ)
        if spec.container is None:
            check_command_files(*volumes.host_command(host_volumes, spec.nodes[0].command, spec.cwd),
                                provided=job_dir)  # a missing script: nothing starts
        else:  # a missing image: nothing starts (pulled now when the policy says so)
            from trainjob.backends.local.containers import ensure_image

            ensure_image(spec.container.tool, spec.container.image, self.config.pull_policy)
        ttl = ttl_seconds(trainjob.metadata.annotations)
        priority, queue_name = queue.job_priority(trainjob), queue.queue_name(trainjob)
        request = queue.job_request(plan)
        queued = not request.empty and not queue.oversubscribing(trainjob)
        scaled = None
        if queued:
            scaled = self._scale_if_too_big(trainjob, plan, request, spec)
        else:  # best effort or oversubscribed: starts at once and holds nothing in the queue's books
            request = queue.Request(plan.num_nodes)
        self.collect_garbage()
        now = time.time()
        resource = trainjob.to_dict()
        resource.pop("status", None)
        uid = str(uuid.uuid4())
        resource["metadata"].update(uid=uid, creationTimestamp=views.rfc3339(now))
        status = types.SUSPENDED if plan.suspend else types.QUEUED if queued else types.CREATED
        reason = {types.SUSPENDED: "Suspended", types.QUEUED: queue.PENDING_REASON}.get(status, "Created")
        message = None
        if status == types.SUSPENDED:  # what would start it: on a cluster, Kueue; here, the user
            message = f"created suspended (spec.suspend: true); `trainjob resume {name}` starts it"
            if queue_name:
                message += (f" (its queue {queue_name!r} is this machine's own, which admits it in queue order "
                            "once resumed and it fits; no Kueue runs here to resume it)")
        self.store.insert_job({
            "name": name, "namespace": trainjob.namespace, "uid": uid, "status": status,
            "reason": reason, "message": message, "runtime": plan.runtime_name,
            "num_nodes": launch.num_nodes, "num_proc_per_node": launch.num_proc_per_node, "created": now,
            "resource": resource, "launch": spec.to_dict(), "priority": priority.value,
            # a scaled job may ask for more than SQLite counts (2 nodes x 4Ei); what it holds is the machine anyway
            "cpus": min(request.cores, MAX_COUNT), "memory_bytes": min(request.memory, MAX_COUNT),
            "gpus": min(request.gpus, MAX_COUNT), "ttl_seconds": ttl,
            "priority_source": priority.source, "queue_name": queue_name,
            "scaled": scaled.summary if scaled else None,
        })
        try:
            shutil.rmtree(job_dir, ignore_errors=True)  # leftovers of a job of the same name
            (job_dir / "logs").mkdir(parents=True)
            if host_volumes is not None:
                volumes.prepare(host_volumes, job_dir)
            for file_name, text in (files or {}).items():
                (job_dir / file_name).write_text(text, encoding="utf-8")
            events = submit_events(trainjob, plan)  # converted from a PyTorchJob, NCCL settings that do nothing
            with self.store.transaction():  # the job's first events: one write
                created = f"{launch.num_nodes} node(s) x {launch.num_proc_per_node} process(es) on runtime " \
                    f"{plan.runtime_name}"
                if queue_name:
                    created += f"; queue {queue_name}"
                if priority.source:
                    created += f"; {priority.describe()}"
                self.store.add_event(name, "Created", created)
                if scaled is not None:
                    self.store.add_event(name, scaling.SCALED_REASON, scaled.detail, type="Warning")
                for reason, message in spec.notes:
                    self.store.add_event(name, reason, message)
                for event in events:
                    self.store.add_event(name, event.reason, event.message, type=event.type)
            if status == types.CREATED:
                self._start_supervisor(name)
            elif status == types.QUEUED:
                self.admit_queued()
        except BaseException:
            self.store.delete_job(name)
            volumes.release(job_dir, self.store.jobs_dir)
            shutil.rmtree(job_dir, ignore_errors=True)
            raise

    def _scale_if_too_big(self, trainjob: TrainJobResource, plan: Plan, request: Request,
                          spec: ProcessSpec) -> Scaling | None:
        """When ``request`` could never fit this machine: refused (strict resources, with the numbers), or ``spec``
        laid out over the whole machine and the :class:`~trainjob.backends.local.client.scaling.Scaling` returned;
        ``None`` when it fits."""
        from trainjob.backends.local import queue
        from trainjob.backends.local.client import scaling

        machine = queue.Machine.detect()
        strict = scaling.strict_resources(trainjob, self.config.strict_resources)
        if not queue.shortfalls(request, machine):
            return None
        if strict:
            queue.check_fits(request, machine, why=f"strict resources are on ({strict}); without them the job would "
                             "run alone, scaled to this machine")
        processes = plan.mpi.slots if plan.mpi is not None else plan.num_proc_per_node
        job_sets_omp = "OMP_NUM_THREADS" in plan.trainer().container().env_dict(0)
        return scaling.scale_to_machine(spec, request, machine, processes, job_sets_omp)

    def _resolve_host_volumes(self, plan: Any, job_dir: Path, spec: Any,
                      config_maps: Mapping[str, str | Path] | None) -> volumes.HostVolumes | None:
        """The job's host volumes (:mod:`~trainjob.backends.local.volumes`), applied to ``spec``; checked only."""
        from trainjob.backends.local import volumes

        settings = volumes.VolumeSettings.resolve(self.store.home, self.config.volumes_root,
                                                  {**self.config.config_maps, **(config_maps or {})},
                                                  self.config.mount_mechanism)
        if spec.container is not None:
            settings.mechanism = volumes.CONTAINER
        host_volumes = volumes.resolve_host_volumes(plan, job_dir, settings)
        if host_volumes is not None:
            volumes.apply_to_process_spec(host_volumes, spec)
        return host_volumes

    def _start_supervisor(self, name: str, replacing: bool = False) -> None:
        """Start the job's supervisor (:func:`~trainjob.backends.local.supervisor.start.start_supervisor`)."""
        start_supervisor(self.store, name, replacing)

    def admit_queued(self) -> list[str]:
        """Start the queued jobs that fit what is free now (:func:`~trainjob.backends.local.queue.admit`), each
        through :meth:`_start_supervisor` (as :func:`~trainjob.backends.local.supervisor.start.admit` does)."""
        from trainjob.backends.local import queue

        admitted = queue.admit(self.store)
        for name in admitted:
            self._start_supervisor(name)
        return admitted

    def collect_garbage(self, now: float | None = None) -> list[str]:
        """Delete the finished jobs whose ``trainjob/ttl-seconds-after-finished`` has run out; their names."""
        deleted = []
        for name in expired_jobs(self.store, time.time() if now is None else now):
            with contextlib.suppress(NotFoundError):  # another reader removed it first
                self.delete_job(name)
                deleted.append(name)
        return deleted

    # reading jobs

    def list_jobs(self, runtime: types.Runtime | None = None) -> list[types.TrainJob]:
        """Every job, oldest first (only those on ``runtime`` when given); steps are left empty."""
        self.housekeeping()
        rows = self._checked(self.store.list_jobs())
        if runtime is not None:
            rows = [row for row in rows if row["runtime"] == runtime.name]
        return [views.sdk_job(row) for row in rows]

    def list_jobs_with_resources(self) -> list[types.TrainJob]:
        """Every job as :meth:`get_job` gives it (steps, and the resource with its status), oldest first, read in
        one pass over the store rather than a read per job: what ``trainjob list -o json|yaml|wide`` shows."""
        self.housekeeping()
        rows = self._checked(self.store.list_full_jobs())
        nodes = self.store.all_nodes()
        return [views.sdk_job(row, nodes.get(row["name"], [])) for row in rows]

    def list_resources(self) -> list[dict[str, Any]]:
        """Every job's TrainJob resource with its status (as ``get_job(name).resource``), oldest first, in one read
        and without the SDK's objects: what ``trainjob list -o json|yaml|name`` prints."""
        self.housekeeping()
        rows = self._checked(self.store.list_full_jobs())
        nodes = self.store.all_nodes()
        return [views.resource_with_status(row, nodes.get(row["name"], [])) for row in rows]

    def list_summaries(self) -> list[types.JobSummary]:
        """One summary per job, oldest first, supervisors checked.

        The fast path of ``trainjob list``: read from the store's summary columns, no per-job SDK objects, so
        thousands of jobs list in milliseconds.
        """
        self.housekeeping()
        summaries = self.store.list_summaries()
        if self._check_supervisors(summaries):
            summaries = self.store.list_summaries()
        return [views.job_summary(summary) for summary in summaries]

    def list_resource_texts(self) -> list[str]:
        """Every job's resource with its status (as :meth:`list_resources` gives it) as
        :func:`~trainjob.json_text.indented_json` writes it, oldest first: what ``trainjob list -o json`` prints.

        The store keeps each text until the job's row or its nodes change, so a listing writes only the jobs that
        changed since the last one: ten thousand finished jobs list as fast as the store reads them.
        """
        self.housekeeping()
        listed = self.store.renderings()
        if self._check_supervisors(listed) or any(text is None for _, _, text, *_ in listed):
            from trainjob.json_text import indented_json

            with self.store.transaction():  # nothing changes a job between reading and keeping its text
                rows = self.store.list_full_jobs(unrendered=True)
                nodes = self.store.all_nodes()
                self.store.save_renderings({
                    row["name"]: indented_json(views.resource_with_status(row, nodes.get(row["name"], [])))
                    for row in rows
                })
                listed = self.store.renderings()
        return [text for _, _, text, *_ in listed]

    def _check_supervisors(self, listed: list[tuple[Any, ...]]) -> bool:
        """Replace the lost supervisors of the active jobs in ``listed`` (tuples of the job's name and status first,
        its supervisor's pid and start time last); whether any was found lost."""
        stale = [
            name
            for name, status, *_, pid, pid_started in listed
            if status in ACTIVE_STATUSES and pid and not processes.is_alive(pid, pid_started)
        ]
        if stale:
            self._checked(self.store.list_jobs(stale))
        return bool(stale)

    def expired_jobs(self, now: float) -> list[str]:
        return expired_jobs(self.store, now)

    def node_processes(self, name: str) -> dict[int, NodeProcess]:
        """Each node's keeper process, its status and exit code (``NotFoundError`` for unknown jobs)."""
        self.store.get_job(name)
        return {row["idx"]: NodeProcess(row["status"], row["pid"], row["exit_code"]) for row in self.store.nodes(name)}

    def housekeeping(self) -> None:
        """What a controller would do between commands: remove expired jobs, admit queued ones that fit."""
        self.collect_garbage()
        if self.store.has_status(types.QUEUED):
            self.admit_queued()

    def get_job(self, name: str) -> types.TrainJob:
        row = self._checked_one(name)
        return views.sdk_job(row, self.store.nodes(name))

    def get_job_events(self, name: str) -> list[types.Event]:
        self.store.get_job(name)
        return [views.sdk_event(row) for row in self.store.events(name)]

    def get_job_stacks(self, name: str) -> list[RankStacks]:
        """Every running rank's Python stacks (:mod:`~trainjob.backends.local.stacks`): each training process
        dumps its threads when signalled, even when blocked in a collective."""
        from trainjob.backends.local.stacks import dump_stacks

        row = self._checked_one(name)
        if row["status"] != types.RUNNING:
            raise ValidationError("NAME", f"TrainJob {name} is {row['status']}; stacks are read from the ranks of a "
                                  "Running job")
        stacks = dump_stacks(self.store.job_dir(name))
        if not stacks:
            raise BackendError(f"TrainJob {name} has no training process running now (starting, restarting, or a "
                               "command that is not a Python training script)")
        return stacks

    def _launch_shape(self, name: str) -> tuple[int, int | None]:
        row = self.store.get_job(name)
        return row["num_nodes"], row["num_proc_per_node"]

    def _read_logs(self, name: str, nodes: list[int], request: LogRequest) -> Iterator[types.LogLine]:
        """The node files' lines (:func:`~trainjob.backends.local.log_reader.read_logs`); ``follow`` streams until
        the job ends."""
        from trainjob.backends.local.log_reader import read_logs
        from trainjob.backends.local.log_writer import log_dir

        job_dir = self.store.job_dir(name)
        if request.previous and not log_dir(job_dir, previous=True).is_dir():
            raise NotFoundError(f"TrainJob {name} has no previous attempt: it was not restarted or resumed")
        until = request.until
        if until is None:
            return read_logs(job_dir, nodes, rank=request.rank, follow=request.follow,
                             finished=lambda: self._settled(name), since=request.since, tail=request.tail,
                             previous=request.previous, stop_output=request.stop_output)
        # a long-lived watcher (the dashboard, one per open page) reads at the store's pace
        return read_logs(job_dir, nodes, rank=request.rank, follow=request.follow,
                         finished=lambda: until() or self._settled(name), poll_interval=LOCAL_POLL_SECONDS,
                         since=request.since, tail=request.tail, previous=request.previous,
                         stop_output=request.stop_output)

    def metric_records(self, name: str, after: float = 0) -> list[dict[str, Any]]:
        """Every metric record the job reported after the record ``after`` (the store keeps them all)."""
        self.store.get_job(name)  # NotFoundError for an unknown job
        return [{"id": r["id"], "time": r["time"], "step": r["step"], "metrics": r["metrics"]}
                for r in self.store.metrics(name, after=int(after))]

    def _settled(self, name: str) -> bool:
        """Whether the job has ended (or is gone); asked on every poll of a followed log, so reads a narrow row."""
        try:
            rows = self._checked(self.store.list_jobs([name]))
        except NotFoundError:  # deleted while its supervisor was being checked
            return True
        return not rows or rows[0]["status"] not in UNFINISHED_STATUSES

    # changing jobs

    def delete_job(self, name: str) -> None:
        """Stop every process of the job, then remove its state, logs and environment."""
        from trainjob.backends.local import volumes

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
        _remove_containers(name, job_dir, row)
        self.store.delete_job(name)
        volumes.release(job_dir, self.store.jobs_dir)  # claims are kept; emptyDirs go with the job's directory
        shutil.rmtree(job_dir, ignore_errors=True)
        if row["status"] in UNFINISHED_STATUSES:
            self.admit_queued()  # what it held is free

    def _stop_job_processes(self, name: str, row: dict[str, Any]) -> None:
        """Stop the node keepers (each stops its node and whatever the node left behind), then sweep."""
        from trainjob.backends.local.node_keeper.keeper import KEEPER_STOP_SECONDS

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
        if self.store.transition(name, types.SUSPENDED, "Suspended", "suspended while queued; resume to queue it again",
                                 from_statuses=(types.QUEUED,)):
            self.store.add_event(name, "Suspended", "left the queue")
            self.admit_queued()  # jobs behind it may fit now
            return
        if row["status"] not in ACTIVE_STATUSES:
            raise ValidationError("status", f"TrainJob {name} is {row['status']}; only Created or Running jobs can be suspended")
        self.store.update_job(name, request="suspend")
        deadline = time.monotonic() + timeout
        self.wait_for_job_status(name, {types.SUSPENDED}, timeout=timeout, polling_interval=LOCAL_POLL_SECONDS)
        # The supervisor writes Suspended, then admits queued jobs before it exits: return once it is gone too.
        row = self.store.get_job(name)
        while processes.is_alive(row["supervisor_pid"], row["supervisor_started"]) and time.monotonic() < deadline:
            time.sleep(LOCAL_POLL_SECONDS)

    def resume_job(self, name: str) -> None:
        """Start a suspended job's nodes again (from the beginning: scripts resume from their checkpoints)."""
        row = self.store.get_job(name)
        queued = bool(row["cpus"] or row["memory_bytes"] or row["gpus"])
        if not self.store.transition(name, types.QUEUED if queued else types.CREATED, "Resumed", "resumed by the user",
                                     from_statuses=(types.SUSPENDED,), request=None, finished=None):
            row = self.store.get_job(name)
            raise ValidationError("status", f"TrainJob {name} is {row['status']}; only Suspended jobs can be resumed")
        self.store.add_event(name, "Resumed", "node processes will start again")
        if queued:
            self.admit_queued()
        else:
            self._start_supervisor(name)

    # runtimes

    def list_runtimes(self) -> list[types.Runtime]:
        from trainjob.runtime import builtin_runtimes

        return [runtime_view(r.to_dict()) for _, r in sorted(builtin_runtimes().items())]

    def get_runtime(self, name: str) -> types.Runtime:
        from trainjob.runtime import find_runtime

        return runtime_view(find_runtime(name).to_dict())

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
        if not row["supervisor_pid"] or self._supervisors.alive(row["supervisor_pid"], row["supervisor_started"]):
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
            self.admit_queued()


__all__ = ["LocalBackend", "LocalProcessBackendConfig"]


def _remove_containers(name: str, job_dir: Path, row: dict[str, Any]) -> None:
    """Remove a deleted job's containers and network, if its nodes ran as containers."""
    from trainjob.backends.local.containers import ContainerSpec, remove_job_containers

    launch = row.get("launch")
    spec = ContainerSpec.from_dict((launch or {}).get("container") if isinstance(launch, dict) else None)
    if spec is not None:
        remove_job_containers(spec.tool, name, str(job_dir))
