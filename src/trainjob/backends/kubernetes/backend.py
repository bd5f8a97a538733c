"""The SDK and CLI side of Kubernetes: create TrainJob objects, read jobs, events and pod logs from the API server.

The operator (``trainjob operator``, installed by ``trainjob install``) turns the objects into JobSets; this class
only talks to the API server::

    backend = KubernetesBackend(KubernetesBackendConfig(namespace="ml-team"))
    job = backend.apply(TrainJob.from_dict(manifest))
    backend.wait_for_job_status(job.name, {"Running"})
    for line in backend.logs(job.name, node=0, follow=True):
        print(line)
"""

from __future__ import annotations

import contextlib
import heapq
import json
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from trainjob.backends.base import Backend, CheckedJob, LogRequest, runtime_view
from trainjob.backends.kubernetes import views
from trainjob.backends.kubernetes.config import KubernetesBackendConfig, load_api_client, resolve_namespace
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.kueue import QUEUE_LABEL, queue_state
from trainjob.backends.kubernetes.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    JOBSETS,
    KUEUE_WORKLOADS,
    RUNTIME_KINDS,
    TRAINING_RUNTIMES,
    TRAINJOBS,
)
from trainjob.constants import (
    LAUNCH_ANNOTATION,
    STACKS_REQUEST_ANNOTATION,
    STACKS_REQUEST_FILE,
    TRAINING_RUNTIME_KIND,
    TRAINJOB_NAME_LABEL,
)
from trainjob.errors import AlreadyExistsError, NotFoundError, TrainJobError
from trainjob.sdk import types

if TYPE_CHECKING:
    from trainjob.api import Runtime as RuntimeResource
    from trainjob.api import TrainJob as TrainJobResource
    from trainjob.backends.stacks import RankStacks
    from trainjob.sdk.trainers import TrainerFunction

_POD_WAIT_POLL = 0.5
#: ``trainjob stacks`` on Kubernetes: how long to wait for the ranks' answers, and how often their logs are read.
STACKS_WAIT_SECONDS = 60.0
STACKS_POLL_SECONDS = 1.0
_FINISHED_PHASES = ("Succeeded", "Failed")


class KubernetesBackend(Backend):
    """Jobs as TrainJob objects on a cluster (see :class:`trainjob.backends.base.Backend`)."""

    backend_name = "kubernetes"
    job_name_prefix = "t"
    trainer_required = False  # a job made of the runtime and the options alone runs the runtime's command

    def __init__(
        self, config: KubernetesBackendConfig | None = None, *, pod_start_timeout: float = 600.0
    ) -> None:
        self.config = config or KubernetesBackendConfig()
        self.namespace = resolve_namespace(self.config)
        self.api = KubeApi(load_api_client(self.config))
        self.pod_start_timeout = pod_start_timeout

    # -- creating ---------------------------------------------------------------------------------------------------

    def check(self, trainjob: TrainJobResource, runtimes: Sequence[RuntimeResource] = ()) -> CheckedJob:
        """``trainjob`` placed in its namespace (the configured one unless it names another) and resolved against
        its runtime: the one among ``runtimes`` it names, else the cluster's; a job the operator would reject
        fails here with the same ``ValidationError``. Creates nothing."""
        from trainjob.backends.ttl import ttl_seconds
        from trainjob.runtime import resolve

        ttl_seconds(trainjob.metadata.annotations)  # the operator ignores a TTL it cannot read: refuse it here
        body = trainjob.to_dict()
        body.pop("status", None)
        meta = body["metadata"]
        if meta.get("namespace") in (None, "default"):
            meta["namespace"] = self.namespace
        placed = type(trainjob).from_dict(body)  # resolved where it will live (the runtime's namespace rule)
        ref = placed.spec.runtime_ref
        given = [r for r in runtimes if r.kind == ref.kind and r.name == ref.name]
        runtime = self._placed_runtime(given[0], meta["namespace"]) if given else self._runtime_resource(
            ref.kind, ref.name, meta["namespace"])
        return CheckedJob(placed, resolve(placed, runtime))

    def apply(
        self, trainjob: TrainJobResource, runtimes: Sequence[RuntimeResource] = (), *, checked: CheckedJob | None = None
    ) -> types.TrainJob:
        """Create ``trainjob`` (in the configured namespace unless it names another one).

        ``runtimes`` given with it are created or updated first. The job is resolved (:meth:`check`, unless
        ``checked`` is what it returned) before it is sent, and the launch values it resolved to go with it as
        the ``trainjob/launch`` annotation."""
        checked = checked or self.check(trainjob, runtimes)
        body = checked.trainjob.to_dict()
        body.pop("status", None)
        meta = body["metadata"]
        for runtime in runtimes:
            self._apply_runtime(runtime.to_dict(), meta["namespace"])
        # The numbers it resolved to, read back by every view (the operator writes them again when it builds).
        meta.setdefault("annotations", {})[LAUNCH_ANNOTATION] = json.dumps(checked.launch.to_dict())
        try:
            created = self.api.create(body, TRAINJOBS)
        except AlreadyExistsError as exc:
            raise AlreadyExistsError(
                f"TrainJob {meta['name']!r} exists already in namespace {meta['namespace']!r}; "
                "delete it or choose another metadata.name"
            ) from exc
        return views.trainjob_view(created, [])

    def _create_trainjob(self, job: dict[str, Any], function: TrainerFunction | None) -> str:
        """Create ``job``; a ``CustomTrainer``'s function is shipped in the trainer's environment and run with
        torchrun on every node (:func:`trainer_spec`), a ``CustomTrainerContainer`` runs its image."""
        from trainjob.api import TrainJob

        runtime_name = job["spec"]["runtimeRef"]["name"]
        if self.api.get(TRAINING_RUNTIMES, self.namespace, runtime_name) is not None:
            job["spec"]["runtimeRef"]["kind"] = TRAINING_RUNTIME_KIND  # as get_runtime finds it: the namespace's first
        if function is not None:
            shipped = trainer_spec(function)
            job["spec"]["trainer"]["command"] = shipped["command"]
            job["spec"]["trainer"]["env"] = shipped["env"] + job["spec"]["trainer"].get("env", [])
        return self.apply(TrainJob.from_dict(job)).name

    def get_runtime_packages(self, runtime: types.Runtime | str, timeout: float = 600) -> None:
        """Print the Python version, ``pip list`` and ``nvidia-smi`` of ``runtime``'s trainer image, from a
        one-node TrainJob that runs them (deleted afterwards), as the Kubeflow SDK does."""
        from trainjob.api import TrainJob

        runtime_name = runtime.name if isinstance(runtime, types.Runtime) else runtime
        self.get_runtime(runtime_name)  # NotFoundError naming the runtimes there are
        script = ("import subprocess, sys; print('Python:', sys.version, flush=True); "
                  "subprocess.run([sys.executable, '-m', 'pip', 'list']); "
                  "subprocess.run('nvidia-smi || true', shell=True)")
        name = f"p{uuid.uuid4().hex[:11]}"
        job = TrainJob.from_dict({
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"runtimeRef": {"name": runtime_name},
                     "trainer": {"numNodes": 1, "command": ["python", "-c", script]}},
        })
        self.apply(job)
        try:
            self.wait_for_job_status(name, {types.COMPLETE, types.FAILED}, timeout=timeout)
            for line in self.logs(name, node=0):
                print(line.text, flush=True)
        finally:
            self.delete_job(name)

    # -- reading ----------------------------------------------------------------------------------------------------

    def get_job(self, name: str) -> types.TrainJob:
        job = self._job(name)
        pods = self.api.list_pods(self.namespace, f"{TRAINJOB_NAME_LABEL}={name}")
        return views.trainjob_view(job, pods, self._jobsets(name).get(name), self._queued([job]).get(name))

    def list_jobs(self, runtime: types.Runtime | None = None) -> list[types.TrainJob]:
        jobs = self.api.list(TRAINJOBS, self.namespace)
        pods = self.api.list_pods(self.namespace, TRAINJOB_NAME_LABEL)
        by_job: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            by_job.setdefault(pod["metadata"]["labels"][TRAINJOB_NAME_LABEL], []).append(pod)
        jobsets = self._jobsets()
        queued = self._queued(jobs)
        views_ = [views.trainjob_view(j, by_job.get(j["metadata"]["name"], []), jobsets.get(j["metadata"]["name"]),
                                      queued.get(j["metadata"]["name"]))
                  for j in jobs]
        if runtime is not None:
            views_ = [v for v in views_ if v.runtime_name == runtime.name]
        return sorted(views_, key=lambda v: v.creation_timestamp)

    def _queued(self, jobs: list[dict[str, Any]]) -> dict[str, str]:
        """Where each of ``jobs`` that waits in a Kueue queue stands, by name; the Workloads are listed only when
        one of them is queued and not admitted, and not at all when Kueue is not installed or not readable."""
        waiting = [j for j in jobs if (j["metadata"].get("labels") or {}).get(QUEUE_LABEL)
                   and (j.get("spec") or {}).get("suspend")]
        if not waiting:
            return {}
        try:
            workloads = self.api.list(KUEUE_WORKLOADS, self.namespace)
        except TrainJobError:
            return {}
        found = {j["metadata"]["name"]: queue_state(j, workloads) for j in waiting}
        return {name: state for name, state in found.items() if state}

    def _jobsets(self, name: str | None = None) -> dict[str, dict[str, Any]]:
        """The jobs' JobSets by job name (where the operator records the runtime snapshot and launch values);
        none when this user may not read JobSets (the view then comes from the job and its pods)."""
        selector = f"{TRAINJOB_NAME_LABEL}={name}" if name else TRAINJOB_NAME_LABEL
        try:
            found = self.api.list(JOBSETS, self.namespace, label_selector=selector)
        except TrainJobError:
            return {}
        return {js["metadata"]["name"]: js for js in found if (js["metadata"].get("labels") or {}).get(TRAINJOB_NAME_LABEL)
                == js["metadata"]["name"]}

    def get_job_events(self, name: str) -> list[types.Event]:
        """Events of the TrainJob, its JobSet, Jobs and pods (all named after the job), oldest first."""
        self._job(name)
        events = self.api.list_events(self.namespace, name, include_children=True)
        return [views.event_view(e) for e in events]

    def list_runtimes(self) -> list[types.Runtime]:
        found = {r["metadata"]["name"]: r for r in self.api.list(CLUSTER_TRAINING_RUNTIMES)}
        found.update({r["metadata"]["name"]: r for r in self.api.list(TRAINING_RUNTIMES, self.namespace)})
        return [runtime_view(r) for _, r in sorted(found.items())]

    def get_runtime(self, name: str) -> types.Runtime:
        for ref, namespace in ((TRAINING_RUNTIMES, self.namespace), (CLUSTER_TRAINING_RUNTIMES, None)):
            if (obj := self.api.get(ref, namespace, name)) is not None:
                return runtime_view(obj)
        known = ", ".join(r.name for r in self.list_runtimes()) or "none"
        raise NotFoundError(
            f"runtime {name!r} not found in namespace {self.namespace!r} or the cluster; known: {known}"
        )

    def expired_jobs(self, now: float) -> list[str]:
        """Jobs whose TTL has run out (the operator removes them; ``trainjob gc`` does at once)."""
        from trainjob.backends.kubernetes.ttl import ttl_remaining

        return [job.name for job in self.list_jobs()
                if (left := ttl_remaining(job.resource, now)) is not None and left <= 0]

    # -- logs -------------------------------------------------------------------------------------------------------

    def _launch_shape(self, name: str) -> tuple[int, int | None]:
        job = self.get_job(name)
        return job.num_nodes, job.num_proc_per_node

    def _read_logs(self, name: str, nodes: list[int], request: LogRequest) -> Iterator[types.LogLine]:
        """The nodes' pod logs merged by the time the kubelet stamped them.

        ``since`` (Unix time), ``tail`` (lines in all) and ``previous`` (the pods' previous containers) are
        passed to the API server's ``pods/log``. With ``follow`` the lines stream as the pods write them; a pod
        that has not started yet is waited for (up to ``pod_start_timeout``), and the stream ends when the pods
        finish. ``stop_output`` changes nothing: a pod's log is what the pod wrote.
        """
        rank, follow, since, tail, previous = request.rank, request.follow, request.since, request.tail, request.previous
        options: dict[str, Any] = {"timestamps": True}
        if since is not None:
            options["since_seconds"] = max(1, math.ceil(time.time() - since))
        if tail is not None:
            options["tail_lines"] = tail
        if previous:
            options["previous"] = True

        def wanted(line: types.LogLine) -> bool:
            return (rank is None or line.rank in (None, rank)) and (since is None or (line.time or 0) >= since)

        if not follow or previous:
            pods = self._trainer_pods(name)
            per_node = []
            for index in nodes:
                if (pod := pods.get(index)) is not None:
                    text = self.api.read_pod_log(self.namespace, pod["metadata"]["name"], **options)
                    per_node.append([line for line in _stamped_lines(index, text.splitlines()) if wanted(line)])
            merged = list(heapq.merge(*per_node, key=lambda line: line.time or 0.0))
            if tail is not None:  # the last ``tail`` lines of all nodes together
                merged = merged[-tail:] if tail else []
            yield from merged
            return
        yield from (line for line in _merge([lambda i=i: self._follow_node(name, i, options) for i in nodes])
                    if wanted(line))

    def _follow_node(self, name: str, index: int, options: dict[str, Any]) -> Iterator[types.LogLine]:
        pod = self._wait_for_pod(name, index)
        buffer = b""
        for chunk in self.api.follow_pod_log(self.namespace, pod["metadata"]["name"], **options):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            yield from _stamped_lines(index, (line.decode(errors="replace") for line in lines))
        if buffer:
            yield from _stamped_lines(index, [buffer.decode(errors="replace")])

    def _wait_for_pod(self, name: str, index: int) -> dict[str, Any]:
        """The node's pod once its container has started (Running or already finished)."""
        deadline = time.monotonic() + self.pod_start_timeout
        while True:
            pod = self._trainer_pods(name).get(index)
            phase = (pod or {}).get("status", {}).get("phase")
            if pod is not None and (phase == "Running" or phase in _FINISHED_PHASES):
                return pod
            if views.job_status(self._job(name))[0] in types.TERMINAL_STATUSES and pod is None:
                raise NotFoundError(f"TrainJob {name} finished without a pod for node {index}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the pod of node {index} of TrainJob {name} did not start in {self.pod_start_timeout:g} s"
                )
            time.sleep(_POD_WAIT_POLL)

    def _trainer_pods(self, name: str) -> dict[int, dict[str, Any]]:
        return views.trainer_pods(self.api.list_pods(self.namespace, f"{TRAINJOB_NAME_LABEL}={name}"))

    def get_job_stacks(self, name: str, timeout: float = STACKS_WAIT_SECONDS,
                       debug_image: str | None = None) -> list[RankStacks]:
        """Every running rank's Python stacks, asked for through the pods and read back from their logs.

        With ``debug_image`` (an image with Python and ``py-spy``), an ephemeral container of it beside each pod's
        training container reads them, whatever the training image and script
        (:mod:`~trainjob.backends.kubernetes.pod_stacks`). Otherwise:

        The job's running pods get the annotation ``trainjob/stacks-request`` set to a new value; the kubelet writes
        it into the pods' status-client volume, where each rank's stacks thread (:mod:`trainjob.torch.rank_stacks`, started
        by ``trainjob.torch.init``) finds it within a second and writes its stacks to its log, headed by the
        request. Waits up to ``timeout`` seconds for every rank (a real kubelet refreshes the volume within its sync
        period, up to a minute or so); a rank that did not answer is listed with why it may not have. Needs the
        operator's status endpoint, which mounts that volume."""
        from trainjob.errors import BackendError, ValidationError
        from trainjob.log_stacks import stacks_in_log

        job = self.get_job(name)
        launch = json.loads((self._job(name)["metadata"].get("annotations") or {}).get(LAUNCH_ANNOTATION) or "{}")
        if job.status != types.RUNNING:
            raise ValidationError("NAME", f"TrainJob {name} is {job.status}; stacks are read from the ranks of a "
                                  "Running job")
        pods = {index: pod for index, pod in self._trainer_pods(name).items()
                if (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")}
        if not pods:
            raise BackendError(f"TrainJob {name} has no pod running now (starting or restarting)")
        # a static job's ranks are known: node i runs ranks i x n .. i x n + n - 1
        per_node = job.num_proc_per_node if not launch.get("elastic") and job.num_proc_per_node else None
        if debug_image:
            return self._stacks_through_debug_containers(pods, per_node, debug_image, timeout)
        if not any(_asks_through_volume(pod) for pod in pods.values()):
            raise BackendError(f"the pods of TrainJob {name} have no way to be asked for their stacks: the operator "
                               "runs without its status endpoint (`trainjob operator --status-url`), which "
                               "mounts the file they are asked through; `trainjob logs` shows what they printed")
        request = str(time.time_ns())
        asked_at = time.time()
        for pod in pods.values():
            self.api.annotate_pod(self.namespace, pod["metadata"]["name"], {STACKS_REQUEST_ANNOTATION: request})
        answers: dict[int, dict[int, str]] = {}
        deadline = time.monotonic() + timeout
        while True:
            since = max(1, math.ceil(time.time() - asked_at) + 2)
            for index, pod in pods.items():
                try:
                    text = self.api.read_pod_log(self.namespace, pod["metadata"]["name"], since_seconds=since)
                except TrainJobError:  # the pod is gone or restarting: what it answered before stays
                    continue
                answers[index] = stacks_in_log(text, request=request) or answers.get(index, {})
            complete = all(len(answers.get(i) or {}) >= (per_node or 1) for i in pods)
            if complete or time.monotonic() >= deadline:
                break
            time.sleep(STACKS_POLL_SECONDS)
        why = (f"no answer in {timeout:g} s: its script does not use trainjob.torch (init or report; "
               f"--debug-image reads any script's), it holds the GIL (a long C call that does not release it), or "
               "the kubelet has not refreshed the pod's volume yet")
        return _rank_stacks(answers, pods, per_node, why)

    def _stacks_through_debug_containers(self, pods: dict[int, dict[str, Any]], per_node: int | None, image: str,
                                         timeout: float) -> list[RankStacks]:
        """The ranks' stacks read by an ephemeral container of ``image`` in each pod (see :mod:`.pod_stacks`)."""
        from trainjob.backends.kubernetes.pod_stacks import dumper_state, ephemeral_container
        from trainjob.log_stacks import stacks_in_log

        request = str(time.time_ns())
        container = ephemeral_container(request, image)
        asked = {index: pod for index, pod in pods.items()
                 if self.api.add_ephemeral_container(self.namespace, pod["metadata"]["name"], container)}
        answers: dict[int, dict[int, str]] = {}
        problems: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while asked and time.monotonic() < deadline:
            for index in list(asked):
                pod_name = asked[index]["metadata"]["name"]
                current = self.api.read_pod(self.namespace, pod_name)
                state = dumper_state(current, container["name"]) if current is not None else {"gone": True}
                if state is None or "terminated" not in state and "gone" not in state:
                    waiting = (state or {}).get("waiting") or {}
                    if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
                        problems[index] = f"the debug image {image} cannot be pulled: {waiting.get('message', '')}"
                        del asked[index]
                    continue
                with contextlib.suppress(TrainJobError):
                    text = self.api.read_pod_log(self.namespace, pod_name, container=container["name"])
                    answers[index] = stacks_in_log(text, request=request)
                    if not answers[index]:
                        problems[index] = f"the debug container found no training process: {text.strip()[-300:]}"
                del asked[index]
            if asked:
                time.sleep(STACKS_POLL_SECONDS)
        why = f"the debug container of its pod did not answer in {timeout:g} s"
        return _rank_stacks(answers, pods, per_node, why, problems)

    # -- changing ---------------------------------------------------------------------------------------------------

    def delete_job(self, name: str) -> None:
        """Delete the TrainJob; its JobSet, Jobs and pods go with it (owner references, foreground: the job object
        stays, terminating, until they are gone). Deleting a job that is already terminating is NotFoundError."""
        self._job(name)
        if not self.api.delete(TRAINJOBS, self.namespace, name):
            raise NotFoundError(f"TrainJob {name!r} not found in namespace {self.namespace!r}")

    def suspend_job(self, name: str) -> None:
        self._set_suspend(name, True)

    def resume_job(self, name: str) -> None:
        self._set_suspend(name, False)

    def _set_suspend(self, name: str, value: bool) -> None:
        if self.api.patch(TRAINJOBS, self.namespace, name, {"spec": {"suspend": value}}) is None:
            raise NotFoundError(f"TrainJob {name!r} not found in namespace {self.namespace!r}")

    # -- helpers ----------------------------------------------------------------------------------------------------

    def _job(self, name: str) -> dict[str, Any]:
        """The TrainJob; a job being deleted counts as gone (its pods are stopping, nothing can change it)."""
        job = self.api.get(TRAINJOBS, self.namespace, name)
        if job is None:
            raise NotFoundError(f"TrainJob {name!r} not found in namespace {self.namespace!r}")
        if job["metadata"].get("deletionTimestamp"):
            raise NotFoundError(f"TrainJob {name!r} not found in namespace {self.namespace!r} (it is being deleted)")
        return job

    def _runtime_resource(self, kind: str, name: str, namespace: str) -> RuntimeResource:
        from trainjob.api import resource_from_dict

        ref = RUNTIME_KINDS[kind]
        obj = self.api.get(ref, namespace if ref.namespaced else None, name)
        if obj is None:
            where = f" in namespace {namespace!r}" if ref.namespaced else ""
            known = ", ".join(sorted(r["metadata"]["name"] for r in self.api.list(ref, namespace))) or "none"
            raise NotFoundError(f"spec.runtimeRef: {kind} {name!r} not found{where}; known: {known}")
        meta = {
            k: v for k, v in obj["metadata"].items() if k in ("name", "namespace", "labels", "annotations")
        }
        return resource_from_dict({**obj, "metadata": meta})  # type: ignore[return-value]

    @staticmethod
    def _placed_runtime(runtime: RuntimeResource, namespace: str) -> RuntimeResource:
        """A runtime given with a job, as :meth:`_apply_runtime` places it (a TrainingRuntime in ``namespace``)."""
        from trainjob.api import resource_from_dict

        obj = runtime.to_dict()
        if RUNTIME_KINDS[obj["kind"]].namespaced:
            obj["metadata"]["namespace"] = namespace
        return resource_from_dict(obj)  # type: ignore[return-value]

    def _apply_runtime(self, obj: dict[str, Any], namespace: str) -> None:
        ref = RUNTIME_KINDS[obj["kind"]]
        if ref.namespaced:
            obj["metadata"]["namespace"] = namespace
        try:
            self.api.create(obj, ref)
        except AlreadyExistsError:
            self.api.patch(
                ref, obj["metadata"].get("namespace"), obj["metadata"]["name"], {"spec": obj["spec"]}
            )


#: What every node runs for a ``CustomTrainer``: no shell, so nothing in the function's source or the package list
#: is ever parsed as a command. Installs the packages (requirements only, after ``--``), writes the program
#: and hands over to torchrun. The program goes to the container's temp folder (``$TMPDIR``, else ``/tmp``).
_LAUNCHER = """\
import json, os, subprocess, sys, tempfile
packages = json.loads(os.environ["TRAINJOB_PACKAGES"])
if packages:
    indexes = json.loads(os.environ["TRAINJOB_PIP_INDEX_URLS"])
    flags = ["--index-url=" + url for url in indexes[:1]] + ["--extra-index-url=" + url for url in indexes[1:]]
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", *flags, "--", *packages])
program = os.path.join(tempfile.gettempdir(), "trainjob_train.py")
with open(program, "w") as f:
    f.write(os.environ["TRAINJOB_PROGRAM"])
os.execvp("torchrun", ["torchrun", program])
"""


def _rank_stacks(answers: dict[int, dict[int, str]], pods: dict[int, Any], per_node: int | None, why: str,
                 problems: dict[int, str] | None = None) -> list[RankStacks]:
    """The stacks each pod's ranks answered, and each rank expected of a pod that did not answer, with why."""
    from trainjob.backends.stacks import RankStacks

    stacks = [RankStacks(rank, text, node=index) for index, ranks in answers.items() for rank, text in ranks.items()]
    for index in pods:
        got = answers.get(index) or {}
        wanted = range(index * per_node, (index + 1) * per_node) if per_node else ([] if got else [index])
        stacks += [RankStacks(rank, None, node=index, problem=(problems or {}).get(index, why))
                   for rank in wanted if rank not in got]
    return sorted(stacks, key=lambda s: s.rank)


def _asks_through_volume(pod: dict[str, Any]) -> bool:
    """Whether the pod mounts the downward-API file ``trainjob stacks`` asks its ranks through."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        for source in (volume.get("projected") or {}).get("sources") or []:
            if any(item.get("path") == STACKS_REQUEST_FILE for item in (source.get("downwardAPI") or {}).get("items") or []):
                return True
    return False


def trainer_spec(function: TrainerFunction) -> dict[str, Any]:
    """The ``command`` and ``env`` of ``spec.trainer`` that ship a ``CustomTrainer``'s checked function
    (:func:`trainjob.sdk.trainers.trainer_function`) as source and run it with torchrun on every node (its other
    fields: :func:`trainjob.sdk.trainers.trainer_fields`).

    The program, the packages and the index URLs travel in environment variables, read by a small launcher run
    with ``python -c``: no shell sees them."""
    shipped = {
        "TRAINJOB_PROGRAM": function.script,  # the same program the local backend runs
        "TRAINJOB_PACKAGES": json.dumps(function.packages),
        "TRAINJOB_PIP_INDEX_URLS": json.dumps(function.pip_index_urls),
    }
    return {
        "command": ["python", "-c", _LAUNCHER],
        "env": [{"name": k, "value": v} for k, v in shipped.items()],
    }


def _stamped_lines(node: int, lines: Iterable[str]) -> Iterator[types.LogLine]:
    """Log lines the API server prefixed with their RFC 3339 time (``timestamps=true``), as ``LogLine`` objects
    with the time and, when torchrun prefixed the line (``[rank3]: ``), the rank."""
    from trainjob.backends.log_selection import parse_line

    for raw in lines:
        stamp, _, text = raw.partition(" ")
        try:
            when = views.parse_time(stamp) if stamp[:1].isdigit() else None
        except ValueError:
            when = None
        line = parse_line(node, text if when is not None else raw)
        line.time = when.timestamp() if when is not None else None
        yield line


def _merge(sources: list[Callable[[], Iterator[types.LogLine]]]) -> Iterator[types.LogLine]:
    """Lines from several followed streams as they arrive (each stream in its own thread)."""
    if len(sources) == 1:
        yield from sources[0]()
        return
    lines: queue.Queue[types.LogLine | BaseException | None] = queue.Queue()

    def pump(source: Callable[[], Iterator[types.LogLine]]) -> None:
        try:
            for line in source():
                lines.put(line)
        except BaseException as exc:  # handed to the reader
            lines.put(exc)
        finally:
            lines.put(None)

    for source in sources:
        threading.Thread(target=pump, args=(source,), daemon=True).start()
    running = len(sources)
    while running:
        item = lines.get()
        if item is None:
            running -= 1
        elif isinstance(item, BaseException):
            raise item
        else:
            yield item
