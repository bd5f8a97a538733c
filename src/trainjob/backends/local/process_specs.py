"""How each node of a plan becomes a process on this machine: command, environment, CPUs, GPUs, ports.

A node process gets its pod's command, args and environment. The torch launch values in it (``PET_NNODES``,
``PET_NPROC_PER_NODE``) are the plan's, as on a cluster; where the nodes meet is this machine's
:class:`~trainjob.runtime.launch.Addressing` (:func:`local_addressing`), turned into ``PET_*`` variables by the
same function that addresses a JobSet's pods (:func:`trainjob.runtime.launch.addressing_env`); the ``PET_*`` values
of both are tabled in :mod:`trainjob.runtime.launch`. Besides them a node gets:

=================================  ====================================================================
``OMP_NUM_THREADS``                the node's CPUs divided by its processes, unless the job sets it
``CUDA_VISIBLE_DEVICES``           the node's GPUs, disjoint between nodes, when GPUs are requested
``TRAINJOB_JOB_NAME/_JOB_DIR``     the job's name and directory
``TRAINJOB_METRICS_FILE``          where ``trainjob.torch.report`` appends metrics (JSON lines)
``PET_LOG_DIR``, ``PET_TEE``       torchrun writes one log per rank and tees it, lines prefixed by rank
``TORCHELASTIC_ERROR_FILE``        where torchrun records the error of a failed node
``TRAINJOB_RESTART_COUNT``         how many times the supervisor restarted the node group so far
``TRAINJOB_STACKS_DIR/_SIGNAL``    where each training process dumps its Python stacks, and the signal that
                                   asks for a dump (:mod:`~trainjob.backends.local.stacks`)
``PYTHONUNBUFFERED``               ``1`` unless set, so logs stream while they are written
``PYTHONPATH``                     starts with :mod:`~trainjob.backends.local.worker_site`: every rank
                                   records its exception in its torchelastic error file, as ``@record``
                                   would, so the job's status names it
=================================  ====================================================================

The rank, master address and port are given to every node, torch or not, so a script with its own rendezvous
(a plain ``python`` job, an MPI job's ranks) finds node 0 too.

An elastic job with ``minNodes < maxNodes`` whose command is ``torchrun`` is *shrinkable*: a lost node does not
stop the others, which go on at the smaller size from their last checkpoint, and the node comes back after
:attr:`ProcessSpec.node_backoff_seconds` (``TRAINJOB_NODE_BACKOFF_SECONDS`` when the job was created, default
10); its ``torchrun`` is :mod:`~trainjob.backends.local.torchrun.elastic_agent` (see
:mod:`~trainjob.backends.local.supervisor.rendezvous`).

A node does not inherit the environment it was started from, as a pod does not inherit the shell of whoever
created it: an exported ``NCCL_DEBUG`` or ``OMP_NUM_THREADS`` here would not reach a pod. It gets only
:data:`PASSED_ENV` (a ``PATH``, ``HOME``, user, locale and temp dir, as a container has; the Python environment:
``VIRTUAL_ENV``, Conda's, ``PYTHONPATH``, ``LD_LIBRARY_PATH``; ``CUDA_VISIBLE_DEVICES``, which restricts the GPUs
jobs may use here; ``TRAINJOB_*``), then the pod's own env. A job created with ``inherit_env``
(``trainjob run --inherit-env``, ``LocalProcessBackendConfig(inherit_env=True)``) inherits everything, and an
``EnvironmentInherited`` event names what (names only, never values); without it, an ``EnvironmentNotInherited``
event names the training settings (``NCCL_*``, ``TORCH_*`` ...) that were left out. What the nodes get is taken
when the job is created and kept with it (:attr:`ProcessSpec.base_env`), so nodes started later by another process
(a queued job, a resume) get the same.

When the job requests CPUs, each node is also pinned (CPU affinity) to its share of this machine's cores. Each node
runs under a keeper (:mod:`~trainjob.backends.local.node_keeper`) that writes its log, capped at the job's
``log_max_bytes`` (``TRAINJOB_LOG_MAX_BYTES`` when the job was created, default 50 MiB per file).
``torchrun`` and ``python`` at the start of a command mean this Python (``-m torch.distributed.run`` for
``torchrun``), or the job's own environment when it installs packages.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainjob.backends.local import IMAGE_FLAGS
from trainjob.backends.local.containers import ContainerSpec, container_env, engine_env, node_host
from trainjob.backends.local.initializer_steps import (
    StepProcessSpec,
    add_workspace,
    claim_template_volumes,
    needs_workspace,
    step_process_spec,
    steps_before_trainer,
    steps_from_dicts,
)
from trainjob.backends.local.log_writer import DEFAULT_LOG_MAX_BYTES, log_max_bytes
from trainjob.backends.local.mpi.hosts import (
    HOSTS_ENV,
    MODULE,
    MPIRUN_NAMES,
    NODE_ENV,
    SLOTS_ENV,
    host_tmpdir,
    hostfile_path,
)
from trainjob.backends.local.node_env import (  # noqa: F401  (part of this module's interface)
    PASSED_ENV,
    PASSED_ENV_PREFIXES,
    passed_env,
    with_python,
)
from trainjob.backends.local.supervisor.rendezvous import RDZV_CONF
from trainjob.backends.local.worker_site import STACKS_DIR_ENV, STACKS_SIGNAL, STACKS_SIGNAL_ENV
from trainjob.backends.stall import StallPolicy
from trainjob.constants import JOB_DIR_ENV, METRICS_FILE_ENV, PET_RDZV_ENDPOINT, PET_RDZV_ID
from trainjob.errors import ValidationError
from trainjob.runtime.launch import Addressing, addressing_env

# Building a spec from a plan (at submit) needs the API's quantities and the MPI plugin; the supervisor, which
# only carries a stored spec out, imports neither (they bring in pydantic), so they are imported where used.
if TYPE_CHECKING:
    from trainjob.runtime.plan import Plan

#: The prefix torchrun puts before every line of a training process (``[rank3]: ...``); :mod:`~trainjob.backends.local.log_reader` parses it.
RANK_PREFIX_TEMPLATE = "[rank${rank}]: "
#: OpenMPI's choice of address for the topology its daemons share through memory (see build_mpi_process_spec).
VMHOLE_ENV = "OMPI_MCA_rtc_hwloc_vmhole"
#: Where the nodes of a job on this machine meet.
LOCAL_HOST = "127.0.0.1"
#: Settings whose absence an ``EnvironmentNotInherited`` event points out: they change how training runs.
TRAINING_ENV_PREFIXES = (
    "NCCL_", "GLOO_", "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "CUDA_", "CUBLAS_", "OMP_", "MKL_", "KMP_", "HF_",
    "TRANSFORMERS_", "WANDB_",
)
#: At most this many names are listed in an environment event.
_LISTED_NAMES = 40


@dataclass
class NodeProcessSpec:
    index: int
    command: list[str]
    env: dict[str, str]
    cpus: list[int] = field(default_factory=list)
    #: The node's GPUs when it runs as a container (a process node gets them as ``CUDA_VISIBLE_DEVICES``).
    gpus: list[str] = field(default_factory=list)


@dataclass
class ProcessSpec:
    """Everything the supervisor needs to start the nodes; stored as JSON with the job."""

    nodes: list[NodeProcessSpec]
    cwd: str
    elastic: bool = False
    max_restarts: int = 0
    #: ``elasticPolicy.minNodes`` (``None``: not elastic).
    min_nodes: int | None = None
    #: How long a lost node of a shrinkable job stays away before it is started again.
    node_backoff_seconds: float = field(default_factory=lambda: node_backoff_seconds())
    active_deadline_seconds: int | None = None
    packages: list[str] = field(default_factory=list)
    pip_index_urls: list[str] = field(default_factory=list)
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    #: (reason, message) events the supervisor records when the job starts.
    notes: list[tuple[str, str]] = field(default_factory=list)
    #: What the nodes get of the environment the job was created from (:func:`passed_env`), captured then, so that
    #: a supervisor started later (a queued job's, a replacement, a resume) starts the nodes the same way.
    base_env: dict[str, str] = field(default_factory=dict)
    #: ``base_env`` is the whole environment, not only :data:`PASSED_ENV`.
    inherit_env: bool = False
    #: The stall watch's settings (:mod:`trainjob.backends.stall`).
    stall: StallPolicy = field(default_factory=StallPolicy)
    #: The nodes run as containers of the job's image (:mod:`~trainjob.backends.local.containers`); ``None``:
    #: as processes of this Python environment.
    container: ContainerSpec | None = None
    #: Pod sets run before the nodes, in order (:mod:`~trainjob.backends.local.initializer_steps`).
    steps: list[StepProcessSpec] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; the environment every node shares is stored once (``shared_env``), so a job's stored size
        grows with its input plus a little per node, not input times nodes."""
        data = asdict(self)
        envs = [node["env"] for node in data["nodes"]]
        shared = {k: v for k, v in envs[0].items() if all(env.get(k) == v for env in envs[1:])} if envs else {}
        for node in data["nodes"]:
            node["env"] = {k: v for k, v in node["env"].items() if k not in shared}
        data["shared_env"] = shared
        return data

    @property
    def shrinkable(self) -> bool:
        """Elastic with room to shrink, run by ``torchrun``: a lost node does not stop the others."""
        return (
            self.elastic and self.min_nodes is not None and self.min_nodes < len(self.nodes)
            and bool(self.nodes) and runs_torchrun(self.nodes[0].command) and self.container is None
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessSpec:
        data = dict(data)
        shared = data.pop("shared_env", {})
        nodes = [NodeProcessSpec(**{**node, "env": {**shared, **node["env"]}}) for node in data["nodes"]]
        notes = [tuple(note) for note in data.get("notes", [])]
        return cls(**{**data, "nodes": nodes, "notes": notes, "stall": StallPolicy.from_dict(data.get("stall")),
                      "container": ContainerSpec.from_dict(data.get("container")),
                      "steps": steps_from_dicts(data.get("steps"))})


def build_process_spec(
    plan: Plan,
    job_dir: Path,
    cwd: str,
    packages: list[str] | None = None,
    pip_index_urls: list[str] | None = None,
    inherit_env: bool = False,
    containers: ContainerSpec | None = None,
) -> ProcessSpec:
    """The process spec of ``plan``; ``ValidationError`` when the trainer has no command to run here.

    ``containers`` (its ``image`` left empty: the trainer's is used): the nodes run as containers of the trainer's
    image (:mod:`~trainjob.backends.local.containers`)."""
    if plan.mpi is not None:  # a launcher and hosts: trainjob.backends.local.mpi
        if containers is not None:
            raise ValidationError("containers", "MPI jobs run as processes on this machine, not as containers; "
                                  "run it without an image (or on Kubernetes)")
        return build_mpi_process_spec(plan, job_dir, cwd, packages, pip_index_urls, inherit_env)
    trainer = plan.trainer()
    container = trainer.container()
    command = [*container.command, *container.args]
    if not command:
        raise ValidationError(
            "spec.trainer.command",
            "the local backend needs a command to run (an image's entrypoint is not used locally), got none",
        )
    resources = container.resources.effective()
    notes: list[tuple[str, str]] = []
    if containers is not None:
        if not container.image:
            raise ValidationError("spec.trainer.image", "containers run the trainer's image, and it names none; set "
                                  "spec.trainer.image (trainjob run --image IMAGE)")
        limits = {**container.resources.requests, **container.resources.limits}
        containers = container_spec(containers, container.image, limits, container.working_dir)
        notes.append(("ContainersUsed", f"nodes run as {containers.engine} containers of image {container.image}"))
    elif container.image:
        notes.append(("ImageNotUsed", f"image {container.image} is not used locally; nodes run in this Python "
                      f"environment ({IMAGE_FLAGS} run them in it)"))
    steps = steps_before_trainer(plan)
    claim_template_volumes(plan, job_dir)
    if steps and needs_workspace(plan):
        add_workspace(plan, job_dir)
    for other in plan.pod_sets:
        if other is not trainer and other not in steps:
            notes.append(("PodSetSkipped", f"pod set {other.name} ({other.ancestor_step or 'no step'}) does not run "
                          "locally: the trainer does not wait for it"))
    if steps:
        notes.append(("StepsPlanned", "before the nodes, in order: " + ", ".join(p.name for p in steps)))
    requested_cpus = _requested_cpus(resources)
    cpu_sets, cpu_note = share_cpus(plan.num_nodes, requested_cpus)
    gpu_sets, gpu_note = share_gpus(plan.num_nodes, _requested_gpus(resources), visible_gpus())
    notes += [note for note in (cpu_note, gpu_note, environment_note(os.environ, inherit_env)) if note]
    nodes = []
    for index in range(plan.num_nodes):
        env = container.env_dict(index)  # the pod's env, its completion index (PET_NODE_RANK) resolved to ``index``
        env.setdefault("OMP_NUM_THREADS", str(max(1, len(cpu_sets[index]) // max(1, plan.num_proc_per_node))))
        if gpu_sets is not None and containers is None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_sets[index])
        env.update({
            "TRAINJOB_JOB_NAME": plan.job_name,
            JOB_DIR_ENV: str(job_dir),
            METRICS_FILE_ENV: str(job_dir / "metrics.jsonl"),
            "TORCHELASTIC_ERROR_FILE": str(job_dir / "logs" / f"node-{index}.error.json"),
        })
        env.update({STACKS_DIR_ENV: str(job_dir / "stacks"), STACKS_SIGNAL_ENV: str(int(STACKS_SIGNAL))})
        env.setdefault("PET_LOG_DIR", str(job_dir / "logs" / f"node-{index}"))
        env.setdefault("PET_TEE", "3")
        env.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", RANK_PREFIX_TEMPLATE)
        # Pinned only when CPUs were requested; otherwise the nodes float over the machine like plain torchrun.
        pinned = cpu_sets[index] if requested_cpus is not None else []
        gpus = list(gpu_sets[index]) if gpu_sets is not None and containers is not None else []
        nodes.append(NodeProcessSpec(index=index, command=command, env=env, cpus=pinned, gpus=gpus))
    spec = _process_spec(plan, nodes, container.working_dir or cwd, notes, packages, pip_index_urls, inherit_env)
    spec.steps = [step_process_spec(p) for p in steps]
    if containers is not None:
        spec.container, spec.base_env, spec.inherit_env = containers, {}, False
    return spec


def container_spec(engine: ContainerSpec, image: str, resources: Mapping[str, str],
                   working_dir: str | None) -> ContainerSpec:
    """``engine`` with the trainer's image, working directory and per-node limits (``resources``: the pod's limits,
    else its requests: a container here is held to what the job asked for)."""
    from trainjob.api.quantity import parse_quantity

    cpus = float(parse_quantity(resources["cpu"])) if "cpu" in resources else None
    memory = int(parse_quantity(resources["memory"])) if "memory" in resources else None
    return ContainerSpec(engine=engine.engine, engine_path=engine.engine_path, image=image, cpus=cpus,
                         memory_bytes=memory, gpus=_requested_gpus(dict(resources)), working_dir=working_dir,
                         keep=engine.keep, engine_env=engine_env(os.environ))


def _process_spec(plan: Plan, nodes: list[NodeProcessSpec], cwd: str, notes: list[tuple[str, str]],
                 packages: list[str] | None, pip_index_urls: list[str] | None, inherit_env: bool) -> ProcessSpec:
    """The spec of ``nodes``, with what every local job carries: its deadline, elastic settings, packages and the
    environment passed on from here."""
    return ProcessSpec(
        nodes=nodes,
        cwd=cwd,
        elastic=plan.elastic is not None,
        max_restarts=plan.elastic.max_restarts if plan.elastic else 0,
        min_nodes=plan.elastic.min_nodes if plan.elastic else None,
        active_deadline_seconds=plan.active_deadline_seconds,
        packages=list(packages or []),
        pip_index_urls=list(pip_index_urls or []),
        log_max_bytes=log_max_bytes(),
        notes=notes,
        base_env=passed_env(os.environ, inherit_env),
        inherit_env=inherit_env,
    )


def build_mpi_process_spec(
    plan: Plan,
    job_dir: Path,
    cwd: str,
    packages: list[str] | None = None,
    pip_index_urls: list[str] | None = None,
    inherit_env: bool = False,
) -> ProcessSpec:
    """The process spec of an MPI plan (:mod:`trainjob.backends.local.mpi`): node 0 the launcher (and host 0), node
    ``i`` host ``i``; the launcher's ``OMPI_MCA_*`` env is the plugin's with the hostfile in the job's directory."""
    from trainjob.runtime.plugins.mpi import LAUNCHER, openmpi_env

    policy = plan.mpi
    assert policy is not None
    launcher = next(p for p in plan.pod_sets if p.name == LAUNCHER)
    drop_mpi_volumes(plan)
    container = launcher.containers[0]
    command = [*container.command, *container.args]
    if not command:
        raise ValidationError(
            "spec.trainer.command",
            "the local backend needs the launcher's command (e.g. mpirun python train.py), got none",
        )
    if os.path.basename(command[0]) in MPIRUN_NAMES and shutil.which(command[0]) is None:
        raise ValidationError(
            "spec.trainer.command",
            f"{command[0]!r} is not installed on this machine; install OpenMPI (Debian: apt-get install openmpi-bin)",
        )
    hosts = len(policy.hosts)
    resources = container.resources.effective()
    requested_cpus = _requested_cpus(resources)
    cpu_sets, cpu_note = share_cpus(hosts, requested_cpus)
    gpu_sets, gpu_note = share_gpus(hosts, _requested_gpus(resources), visible_gpus())
    notes: list[tuple[str, str]] = []
    if container.image:
        notes.append(("ImageNotUsed", f"image {container.image} is not used locally; nodes run in this Python environment"))
    layout = ", ".join(f"node-{i} is {host}" for i, host in enumerate(policy.hosts))
    notes.append(("MPIHosts", f"{hosts} host(s) x {policy.slots} slot(s) on this machine: {layout}"))
    if not policy.run_launcher_as_node:
        notes.append(("LauncherSharesNode", "the launcher's mpirun runs in node-0's process here (a pod of its own "
                      "on a cluster)"))
    notes += [note for note in (cpu_note, gpu_note, environment_note(os.environ, inherit_env)) if note]
    nodes = []
    for index in range(hosts):
        env = container.env_dict(0)
        env.setdefault("OMP_NUM_THREADS", str(max(1, len(cpu_sets[index]) // policy.slots)))
        if gpu_sets is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_sets[index])
        # the OMPI_MCA_* env of the plugin, with the hostfile where the launcher writes it here
        env.update({var.name: var.value or "" for var in openmpi_env(policy, hostfile=str(hostfile_path(job_dir)))})
        # Every host is this machine, so the daemons need no topology shared through memory mapped at a common
        # address ("VM hole"); OpenMPI 4.1's orted started beside others here at times crashed writing it
        # (SIGSEGV in hwloc_shmem_topology_write), failing the job before any rank ran.
        env.setdefault(VMHOLE_ENV, "none")
        env.setdefault("TMPDIR", str(host_tmpdir(job_dir, index)))  # a /tmp per host, as each pod has
        env.update({
            HOSTS_ENV: json.dumps(policy.hosts),
            NODE_ENV: str(index),
            SLOTS_ENV: str(policy.slots),
            "TRAINJOB_JOB_NAME": plan.job_name,
            JOB_DIR_ENV: str(job_dir),
            METRICS_FILE_ENV: str(job_dir / "metrics.jsonl"),
        })
        role = ["launcher", *command] if index == 0 else ["node"]
        pinned = cpu_sets[index] if requested_cpus is not None else []
        nodes.append(NodeProcessSpec(index=index, command=["python", "-m", MODULE, *role], env=env, cpus=pinned))
    return _process_spec(plan, nodes, container.working_dir or cwd, notes, packages, pip_index_urls, inherit_env)


def drop_mpi_volumes(plan: Plan) -> None:
    """Take the SSH keys and hostfile volumes off ``plan``'s pods: here there is no ``ssh``, and the hostfile is
    written to the job's directory, so only the job's own volumes are left for the local backend to provide."""
    from trainjob.runtime.plugins.mpi import HOSTFILE_VOLUME, SSH_AUTH_VOLUME
    from trainjob.runtime.template import pod_spec

    ours = {HOSTFILE_VOLUME, SSH_AUTH_VOLUME}
    for pod_set in plan.pod_sets:
        spec = pod_spec(pod_set.template)
        if "volumes" in spec:
            spec["volumes"] = [v for v in spec["volumes"] if v.get("name") not in ours]
        for container in pod_set.containers:
            container.volume_mounts = [m for m in container.volume_mounts if m.get("name") not in ours]


def environment_note(environ: Mapping[str, str], inherit_env: bool) -> tuple[str, str] | None:
    """The event that says which of ``environ``'s variables (names only) the nodes inherit, or which training
    settings they do not."""
    extra = sorted(set(passed_env(environ, inherit_env=True)) - set(passed_env(environ)))
    if inherit_env:
        if not extra:
            return None
        return ("EnvironmentInherited",
                f"the nodes inherit {len(extra)} variable(s) of the environment the job was created from: "
                f"{_names(extra)}")
    left_out = [name for name in extra if name.startswith(TRAINING_ENV_PREFIXES)]
    if not left_out:
        return None
    return ("EnvironmentNotInherited",
            f"{_names(left_out)} set where the job was created do(es) not reach the nodes, as on a cluster; set "
            "them in spec.trainer.env (trainjob run --env) or inherit the environment (--inherit-env)")


def _names(names: list[str]) -> str:
    listed = ", ".join(names[:_LISTED_NAMES])
    return listed + (f" and {len(names) - _LISTED_NAMES} more" if len(names) > _LISTED_NAMES else "")


def _requested_cpus(resources: dict[str, str]) -> int | None:
    from trainjob.api.quantity import cpu_count

    return cpu_count(resources["cpu"]) if "cpu" in resources else None


def _requested_gpus(resources: dict[str, str]) -> int:
    from trainjob.api.quantity import gpu_count

    return gpu_count(resources)


def share_cpus(
    num_nodes: int, per_node: int | None, cores: list[int] | None = None
) -> tuple[list[list[int]], str | None]:
    """The cores of each node: ``per_node`` each (default: an equal share), round-robin over ``cores`` (default:
    the cores this process may use).

    On a 2-core machine ``share_cpus(2, None)`` gives ``[[0], [1]]`` and ``share_cpus(2, 2)`` gives
    ``[[0, 1], [0, 1]]`` with a note that the nodes share cores.
    """
    if cores is None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    want = per_node if per_node is not None else max(1, len(cores) // num_nodes)
    take = min(want, len(cores))
    sets = [[cores[(index * take + k) % len(cores)] for k in range(take)] for index in range(num_nodes)]
    note = None
    if want * num_nodes > len(cores):
        note = (
            "CPUsShared",
            f"{num_nodes} node(s) x {want} CPU(s) requested, this machine has {len(cores)} usable; nodes share cores",
        )
    return sets, note


def visible_gpus() -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else the ``/dev/nvidia<N>`` devices."""
    declared = os.environ.get("CUDA_VISIBLE_DEVICES")
    if declared is not None:
        return [d for d in declared.split(",") if d.strip()]
    devices = Path("/dev").glob("nvidia[0-9]*")
    return sorted((d.name.removeprefix("nvidia") for d in devices), key=int)


def share_gpus(num_nodes: int, per_node: int, available: list[str]) -> tuple[list[list[str]] | None, str | None]:
    """Disjoint GPU ids per node, or ``None`` when no GPUs are requested; nodes past the supply get none."""
    if per_node <= 0:
        return None, None
    sets = [available[index * per_node : (index + 1) * per_node] for index in range(num_nodes)]
    note = None
    if per_node * num_nodes > len(available):
        note = (
            "GPUsUnavailable",
            f"{num_nodes} node(s) x {per_node} GPU(s) requested, this machine has {len(available)}; "
            "nodes without GPUs run on CPU",
        )
    return sets, note


NODE_BACKOFF_ENV = "TRAINJOB_NODE_BACKOFF_SECONDS"
DEFAULT_NODE_BACKOFF_SECONDS = 10.0


def node_backoff_seconds() -> float:
    """``$TRAINJOB_NODE_BACKOFF_SECONDS`` (seconds, >= 0), else :data:`DEFAULT_NODE_BACKOFF_SECONDS`."""
    raw = os.environ.get(NODE_BACKOFF_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_NODE_BACKOFF_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValidationError(NODE_BACKOFF_ENV, f"must be a number of seconds >= 0, got {raw!r}")
    return value


def runs_torchrun(command: list[str]) -> bool:
    return bool(command) and os.path.basename(command[0]) == "torchrun"


def node_argv(command: list[str], python: str, shrinkable: bool = False) -> list[str]:
    """``command`` with ``torchrun`` and ``python`` at its start resolved to ``python``; a shrinkable job's
    ``torchrun`` is :mod:`~trainjob.backends.local.torchrun.elastic_agent`."""
    head, rest = os.path.basename(command[0]), command[1:]
    if head == "torchrun":
        module = "trainjob.backends.local.torchrun.elastic_agent" if shrinkable else "torch.distributed.run"
        return [python, "-m", module, *rest]
    if head in ("python", "python3", os.path.basename(sys.executable)):
        return [python, *rest]
    return list(command)


def local_addressing(
    node: NodeProcessSpec, port: int, restarts: int = 0, rendezvous_port: int | None = None
) -> Addressing:
    """Where node ``node`` of a job on this machine meets the others: its index is its rank, the master is
    ``127.0.0.1:{port}``; with ``rendezvous_port`` (a shrinkable job) the rendezvous is the supervisor's store
    there, one per round of the node group (``{job}-{restarts}``).

    >>> local_addressing(NodeProcessSpec(1, ["x"], {"PET_RDZV_ID": "job"}), 40123, 2, 4321).rdzv_id
    'job-2'
    """
    rdzv_id = node.env.get(PET_RDZV_ID, "job")
    if rendezvous_port is None:
        return Addressing(LOCAL_HOST, node_rank=node.index, master_port=port, rdzv_id=rdzv_id)
    return Addressing(
        LOCAL_HOST,
        node_rank=node.index,
        master_port=port,
        rdzv_endpoint=f"{LOCAL_HOST}:{rendezvous_port}",
        rdzv_id=f"{rdzv_id}-{restarts}",
        rdzv_conf=RDZV_CONF,
    )


def node_environment(
    node: NodeProcessSpec,
    port: int,
    python: str,
    restarts: int = 0,
    elastic: bool = False,
    base_env: Mapping[str, str] | None = None,
    rendezvous_port: int | None = None,
    max_restarts: int = 0,
) -> dict[str, str]:
    """The full environment of a node process: ``base_env`` (what it gets of the environment the job was created
    from, :attr:`ProcessSpec.base_env`; default: :func:`passed_env` of this one), then the node's own."""
    env = dict(passed_env(os.environ) if base_env is None else base_env)
    env.update(node.env)
    shrinkable = elastic and rendezvous_port is not None
    addressing = local_addressing(node, port, restarts, rendezvous_port if shrinkable else None)
    # Elastic: the supervisor restarts the whole node group from a fresh rendezvous, so torchrun must not restart
    # alone; shrinkable: the agents restart their ranks when a peer node is lost, up to maxRestarts times.
    rendezvous = addressing_env(
        addressing, rendezvous=elastic or PET_RDZV_ENDPOINT in node.env, max_restarts=max_restarts if shrinkable else 0
    )
    env.update({var.name: var.value for var in rendezvous if var.value is not None})
    env["TRAINJOB_RESTART_COUNT"] = str(restarts)
    return with_python(env, python)


def container_node_environment(node: NodeProcessSpec, port: int, restarts: int = 0,
                               elastic: bool = False) -> dict[str, str]:
    """The environment of a node that runs as a container: the node's own (nothing of this machine's), node 0's
    name on the job's network as the master (:func:`~trainjob.backends.local.containers.node_host`), and trainjob's
    ``sitecustomize`` first on ``PYTHONPATH``."""
    env = dict(node.env)
    job = env.get("TRAINJOB_JOB_NAME", "job")
    rdzv_id = env.get(PET_RDZV_ID, job)
    addressing = Addressing(node_host(job, 0), node_rank=node.index, master_port=port, rdzv_id=f"{rdzv_id}-{restarts}")
    rendezvous = addressing_env(addressing, rendezvous=elastic or PET_RDZV_ENDPOINT in node.env, max_restarts=0)
    env.update({var.name: var.value for var in rendezvous if var.value is not None})
    env["TRAINJOB_RESTART_COUNT"] = str(restarts)
    return container_env(env)
