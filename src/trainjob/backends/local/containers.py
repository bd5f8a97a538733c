"""Nodes as containers: a local job whose image is used runs each node in a container of that image.

``trainjob run --image IMG``, ``trainjob apply --containers`` and ``TrainerClient(ContainerBackendConfig())`` run a
job's nodes with a container engine found on this machine (:func:`find_engine`: Docker where its daemon answers,
else Podman; ``container_runtime`` or ``$TRAINJOB_CONTAINER_ENGINE`` picks one), as the Kubeflow SDK's container
backend does, and otherwise as the process nodes run (same keeper, logs, status, ``stacks``, ``top``, queue):

====================================  ==============================================================================
the network                           one per job (:func:`network_name`), created when its nodes first start and
                                      removed when the job ends or is deleted; every container is on it
a node                                one container (:func:`container_name`), reached by the others at
                                      ``<job>-node-<i>-0`` (a network alias, the JobSet pod's name), so
                                      ``PET_MASTER_ADDR`` is ``<job>-node-0-0`` as on a cluster
its command and environment           the pod's, as given (``torchrun`` and ``python`` are the image's); the host's
                                      environment is not passed, only the pod's env and the ``PET_*``/trainjob
                                      values (by name, ``-e NAME``: no value is on a command line)
the job's directory                   bind-mounted at its own path: logs, metrics, error files and stack dumps
                                      land where the process nodes' do
trainjob's ``sitecustomize``          bind-mounted read-only at :data:`SITE_MOUNT`, first on ``PYTHONPATH`` (it needs
                                      only the standard library): rank errors, stack dumps and collective counts
                                      work in any image
the pod template's volumes            bind mounts (:data:`~trainjob.backends.local.volumes.CONTAINER`)
CPU and memory limits                 ``--cpus`` and ``--memory`` (swap off); the node's CPUs ``--cpuset-cpus``
GPUs                                  ``--device nvidia.com/gpu=<i>`` (Podman, CDI) or ``--gpus device=<i>`` (Docker)
====================================  ==============================================================================

A container the kernel OOM-killed is said so (:func:`container_state`): the node's keeper records it and the
job's failure names the node, its container and its memory limit. Containers carry :data:`JOB_LABEL` (the job's
directory), by which :func:`remove_job_containers` finds whatever a killed run left.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trainjob.errors import ValidationError

ENGINE_ENV = "TRAINJOB_CONTAINER_ENGINE"
ENGINES = ("docker", "podman")
PULL_POLICIES = ("IfNotPresent", "Always", "Never")
#: Where trainjob's ``sitecustomize`` directory is mounted in every container.
SITE_MOUNT = "/opt/trainjob-site"
#: The label every container and network of a job carries: the job's directory.
JOB_LABEL = "trainjob.job-dir"
#: How long an engine command that manages (not runs) containers may take.
ENGINE_TIMEOUT_SECONDS = 120.0
PULL_TIMEOUT_SECONDS = 1800.0
#: Shared memory of a container (``/dev/shm``: DataLoader workers and gloo use it); Docker's default of 64 MiB
#: is too little for DataLoader workers.
DEFAULT_SHM = "1g"


class EngineError(ValidationError):
    """No usable container engine, or one that refused what it was asked; the message names which and why."""


@dataclass
class Engine:
    """A container engine's CLI: ``docker`` or ``podman`` at ``path``."""

    name: str
    path: str

    def command(self, *args: str, timeout: float = ENGINE_TIMEOUT_SECONDS) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.path, *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)


def memory_words(count: int) -> str:
    """A byte count as a pod's limit would say it: ``600Mi``, ``2Gi`` (``1500000b`` when neither is exact)."""
    for suffix, factor in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if count % factor == 0:
            return f"{count // factor}{suffix}"
    return f"{count}b"


def _last_words(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and "failed to connect to syslog" not in line]
    return lines[-1] if lines else "(no output)"


def find_engine(preferred: str | None = None) -> Engine:
    """The engine to run containers with: ``preferred`` (or ``$TRAINJOB_CONTAINER_ENGINE``) when given, else Docker
    where its daemon answers, else Podman. :class:`EngineError` naming what was tried and why each is unusable."""
    wanted = preferred or os.environ.get(ENGINE_ENV) or None
    if wanted is not None and wanted not in ENGINES:
        raise EngineError("container_runtime", f"must be one of {', '.join(ENGINES)}, got {wanted!r}")
    tried = []
    for name in ([wanted] if wanted else ENGINES):
        path = shutil.which(name)
        if path is None:
            tried.append(f"{name}: not installed")
            continue
        engine = Engine(name, path)
        problem = _unusable(engine)
        if problem is None:
            return engine
        tried.append(f"{name}: {problem}")
    raise EngineError(
        "container engine",
        f"no usable container engine ({'; '.join(tried)}); install Podman (apt install podman) or start Docker's "
        "daemon, or run without an image to use this Python environment",
    )


def _unusable(engine: Engine) -> str | None:
    """Why ``engine`` cannot run containers now (Docker: its daemon does not answer), ``None`` when it can."""
    try:
        done = engine.command("version", "--format", "{{.Server.Version}}", timeout=30)
    except subprocess.TimeoutExpired:
        return "did not answer in 30 s"
    if done.returncode != 0 or not done.stdout.strip():
        return _last_words(done.stderr or done.stdout)
    return None


def ensure_image(engine: Engine, image: str, pull_policy: str = "IfNotPresent") -> None:
    """Make sure ``image`` is on this machine: pulled per ``pull_policy`` (``IfNotPresent``, ``Always``, ``Never``);
    :class:`EngineError` at ``spec.trainer.image`` naming the image and what would fix it."""
    if pull_policy not in PULL_POLICIES:
        raise EngineError("pull_policy", f"must be one of {', '.join(PULL_POLICIES)}, got {pull_policy!r}")
    present = engine.command("image", "inspect", "--format", "{{.Id}}", image).returncode == 0
    if present and pull_policy != "Always":
        return
    if pull_policy == "Never":
        raise EngineError("spec.trainer.image", f"image {image} is not on this machine ({engine.name}) and the pull "
                          f"policy is Never; build it ({engine.name} build -t {image} .) or pull it")
    try:
        done = engine.command("pull", image, timeout=PULL_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        done = None
    if done is not None and done.returncode == 0:
        return
    if present:  # Always, and the registry cannot be reached: the image here still runs
        return
    why = _last_words(done.stderr or done.stdout) if done is not None else f"no answer in {PULL_TIMEOUT_SECONDS:.0f} s"
    raise EngineError("spec.trainer.image", f"image {image} is not on this machine ({engine.name}) and could not be "
                      f"pulled: {why}; build it ({engine.name} build -t {image} .) or check its name")


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def network_name(job: str, job_dir: str) -> str:
    """The job's network: its name and a hash of its directory (two homes may hold jobs of one name)."""
    return f"trainjob-{job}-{_short_hash(job_dir)}"


def container_name(job: str, job_dir: str, node: int) -> str:
    """Node ``node``'s container."""
    return f"trainjob-{job}-node-{node}-{_short_hash(job_dir)}"


def node_host(job: str, node: int) -> str:
    """The name node ``node`` is reached at on the job's network: the JobSet pod's name, ``<job>-node-<i>-0``."""
    return f"{job}-node-{node}-0"[:63]


@dataclass
class ContainerSpec:
    """How a job's nodes run as containers; stored with the job's process spec."""

    engine: str
    engine_path: str
    image: str
    #: ``--cpus`` and ``--memory`` of each node (the pod's limits, else its requests), ``None`` for no limit.
    cpus: float | None = None
    memory_bytes: int | None = None
    #: GPUs per node.
    gpus: int = 0
    #: The pod template's ``workingDir`` (``None``: the image's ``WORKDIR``).
    working_dir: str | None = None
    #: Keep each container when its node ends (removed with the job) instead of removing it then.
    keep: bool = False
    #: What the engine's own process gets of the environment the job was created from (:func:`engine_env`).
    engine_env: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ContainerSpec | None:
        return cls(**data) if data else None

    @property
    def tool(self) -> Engine:
        return Engine(self.engine, self.engine_path)


#: What the engine's own process needs of the environment it is started from (its config, storage, daemon).
ENGINE_ENV_NAMES = ("PATH", "HOME", "USER", "TMPDIR", "LANG", "LC_ALL")
ENGINE_ENV_PREFIXES = ("CONTAINERS_", "CONTAINER_", "DOCKER_", "XDG_", "REGISTRY_AUTH_FILE", "BUILDAH_", "PODMAN_")


def engine_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What the engine's process keeps of ``environ`` (taken when the job is created, as a node's environment is)."""
    return {k: v for k, v in environ.items() if k in ENGINE_ENV_NAMES or k.startswith(ENGINE_ENV_PREFIXES)}


def node_command(
    spec: ContainerSpec,
    job: str,
    job_dir: str,
    node: int,
    command: list[str],
    env: Mapping[str, str],
    mounts: Sequence[tuple[str, str, bool, int | None]] = (),
    cpuset: Sequence[int] = (),
    gpus: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """The engine's command line and environment that run node ``node`` (``command`` with ``env``) as a container.

    The node's variables reach the container by name (``-e NAME``, the value taken from the engine's environment,
    so none is on a command line), but for those the engine needs itself (``PATH`` ...), given as ``NAME=VALUE``.
    ``mounts``: ``(mountPath, host path, read-only, tmpfs bytes)`` of the pod's volumes."""
    own = dict(spec.engine_env)
    names = [name if name not in own else f"{name}={value}" for name, value in env.items()]
    process_env = {**{k: v for k, v in env.items() if k not in own}, **own}
    return run_argv(spec, job, job_dir, node, command, names, mounts, cpuset, gpus), process_env


def run_argv(
    spec: ContainerSpec,
    job: str,
    job_dir: str,
    node: int,
    command: list[str],
    env_args: Sequence[str],
    mounts: Sequence[tuple[str, str, bool, int | None]] = (),
    cpuset: Sequence[int] = (),
    gpus: Sequence[str] = (),
) -> list[str]:
    """The ``run`` command line of node ``node``: attached (its output is the node's log, signals reach its first
    process through ``--init``), on the job's network, with ``-e`` of each of ``env_args``."""
    from trainjob.backends.local.worker_site import SITE_DIR

    argv = [spec.engine_path, "run", "--name", container_name(job, job_dir, node),
            "--hostname", node_host(job, node), "--network", network_name(job, job_dir),
            "--network-alias", node_host(job, node), "--label", f"{JOB_LABEL}={job_dir}",
            "--label", f"trainjob.node={node}", "--init", "--shm-size", DEFAULT_SHM,
            "-v", f"{job_dir}:{job_dir}", "-v", f"{SITE_DIR}:{SITE_MOUNT}:ro"]
    argv += _ulimits(spec.engine)
    if spec.cpus is not None:
        argv += ["--cpus", f"{spec.cpus:g}"]
    if cpuset:
        argv += ["--cpuset-cpus", ",".join(str(cpu) for cpu in cpuset)]
    if spec.memory_bytes is not None:
        argv += ["--memory", f"{spec.memory_bytes}b", "--memory-swap", f"{spec.memory_bytes}b"]
    for gpu in gpus:
        argv += ["--device", f"nvidia.com/gpu={gpu}"] if spec.engine == "podman" else ["--gpus", f"device={gpu}"]
    for target, source, read_only, tmpfs_bytes in mounts:
        if tmpfs_bytes is not None:
            argv += ["--tmpfs", f"{target}:size={tmpfs_bytes}"]
        else:
            argv += ["-v", f"{source}:{target}{':ro' if read_only else ''}"]
    if spec.working_dir:
        argv += ["-w", spec.working_dir]
    for name in env_args:
        argv += ["-e", name]
    return [*argv, spec.image, *command]


def _ulimits(engine: str) -> list[str]:
    """This process's open-file and process limits for the container: Podman otherwise asks runc for its own
    defaults (1,048,576 files), which a host with lower hard limits refuses (``error setting rlimit``). Processes
    are held to ``kernel.pid_max`` too, which some hosts enforce on the limit itself."""
    if engine != "podman":
        return []
    argv = []
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = resource.getrlimit(which)
        if which == resource.RLIMIT_NPROC:
            with contextlib.suppress(OSError, ValueError), open("/proc/sys/kernel/pid_max", encoding="ascii") as f:
                ceiling = int(f.read())
                hard = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
                soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
        if hard != resource.RLIM_INFINITY:
            soft = hard if soft == resource.RLIM_INFINITY else soft
            argv += ["--ulimit", f"{name}={soft}:{hard}"]
    return argv


def container_env(env: dict[str, str]) -> dict[str, str]:
    """A node's environment as its container gets it: trainjob's ``sitecustomize`` first on ``PYTHONPATH``."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join([SITE_MOUNT, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def create_network(engine: Engine, job: str, job_dir: str) -> None:
    """The job's network, created unless it exists (a restarted node group keeps it)."""
    name = network_name(job, job_dir)
    if engine.command("network", "inspect", name).returncode == 0:
        return
    done = engine.command("network", "create", "--label", f"{JOB_LABEL}={job_dir}", name)
    if done.returncode != 0 and engine.command("network", "inspect", name).returncode != 0:
        raise EngineError("network", f"{engine.name} network create {name} failed: "
                          f"{_last_words(done.stderr or done.stdout)}")


def container_state(engine: Engine, name: str) -> dict[str, Any] | None:
    """``{"exit_code", "oom_killed"}`` of a stopped container, ``None`` when there is none by that name."""
    done = engine.command("inspect", "--type", "container", "--format", "{{json .State}}", name)
    if done.returncode != 0:
        return None
    with contextlib.suppress(ValueError, IndexError):
        state = json.loads(done.stdout.strip().splitlines()[0])
        return {"exit_code": state.get("ExitCode"), "oom_killed": bool(state.get("OOMKilled"))}
    return None


def memory_cgroup(pid: int) -> str | None:
    """The memory cgroup directory of process ``pid`` (a container's), ``None`` when it cannot be read."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            return f"/sys/fs/cgroup/memory{path}"
    for hierarchy, _, path in lines:
        if hierarchy == "0":
            return f"/sys/fs/cgroup{path}"
    return None


def namespace_pid(pid: int) -> int | None:
    """Process ``pid``'s pid in its own (the container's) pid namespace, ``None`` when it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return None


def oom_kills(cgroup: str) -> int:
    """How many processes the kernel's OOM killer has killed in ``cgroup`` (v1 ``memory.oom_control``, v2
    ``memory.events``); 0 when it cannot be read. The engines report ``OOMKilled`` only when the container's first
    process is the one killed, and a container's ranks are its first process's children."""
    for name in ("memory.oom_control", "memory.events"):
        with contextlib.suppress(OSError, ValueError), open(f"{cgroup}/{name}", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


def remove_container(engine: Engine, name: str) -> None:
    """Remove a container (stopping it first), and its anonymous volumes; nothing when there is none."""
    engine.command("rm", "--force", "--volumes", name)


def remove_job_containers(engine: Engine, job: str, job_dir: str) -> None:
    """Remove every container of the job (by :data:`JOB_LABEL`), then its network."""
    listed = engine.command("ps", "--all", "--quiet", "--filter", f"label={JOB_LABEL}={job_dir}")
    ids = listed.stdout.split() if listed.returncode == 0 else []
    if ids:
        engine.command("rm", "--force", "--volumes", *ids)
    engine.command("network", "rm", network_name(job, job_dir))


def install_first(command: list[str], packages: Sequence[str], index_urls: Sequence[str] = ()) -> list[str]:
    """``command`` run after ``pip install packages`` in the container (a ``CustomTrainer``'s
    ``packages_to_install``: the image's Python gets them, as the Kubeflow SDK's container backend installs them)."""
    indexes = [arg for i, url in enumerate(index_urls) for arg in (("--index-url" if i == 0 else "--extra-index-url"), url)]
    pip = ["python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *indexes, *packages]
    return ["sh", "-c", f'{shlex.join(pip)} && exec "$@"', "sh", *command]
