"""Pod-template volumes on this machine: what each mounted volume of the trainer container is, locally.

The volumes of the trainer's pod template (the runtime's, plus ``podTemplateOverrides`` and ``runtimePatches``)
that its ``node`` container mounts become host paths:

=========================  ========================================================================================
``persistentVolumeClaim``  ``<volumes root>/<namespace>/<claimName>``, created on first use and shared by every node
                           and every later job, like a ReadWriteMany NAS claim; never removed with a job. The root
                           is ``LocalProcessBackendConfig(volumes_root=...)``, else ``$TRAINJOB_VOLUMES_ROOT``, else
                           ``$TRAINJOB_HOME/volumes``
``hostPath``               the path itself, its ``type`` checked as the kubelet does (``Directory``,
                           ``DirectoryOrCreate``, ``File``, ``FileOrCreate``, ``Socket``, ``CharDevice``,
                           ``BlockDevice``)
``emptyDir``               a directory per node under the job's directory, removed when the job is deleted;
                           ``medium: Memory`` is a tmpfs of ``sizeLimit`` (default: this machine's memory), refused
                           at submit when the nodes' limits add up to more than the memory (or, without mount
                           namespaces, the free space of ``/dev/shm``) there is
``configMap``              a file or directory given when the job is created (``trainjob run|apply --config-map
                           NAME=PATH``, ``LocalProcessBackendConfig(config_maps={NAME: PATH})``), copied into the
                           job's directory at submit (``items`` pick and rename keys); always read-only
=========================  ========================================================================================

Other kinds (``secret``, ``nfs``, ``csi`` ...) are refused at submit, naming the kinds supported here.

How the processes see a volume at its ``mountPath`` is picked at submit (``mount_mechanism``, or
``$TRAINJOB_MOUNT_MECHANISM``: ``auto``, ``namespace`` or ``env``) and named in the job's ``VolumesMounted`` event:

- ``namespace`` (``auto`` as root where mount namespaces work): each node runs in a private mount namespace (made
  ``rprivate`` first, so nothing reaches the host) with the volumes bind-mounted at their ``mountPath``
  (:mod:`~trainjob.backends.local.node_keeper.mounts`); ``readOnly`` is enforced, memory-backed ``emptyDir`` is a tmpfs of its
  ``sizeLimit``. A ``mountPath`` that does not exist here is created as an empty directory (or file) and removed
  with the job unless another job still names it. The mounts end with the node's processes.
- ``env`` (not root, or forced): no mounts. Arguments of the command (and values of the pod's env vars, and the
  working directory) that start with a ``mountPath`` are rewritten to the host path; ``readOnly`` and ``sizeLimit``
  are not enforced, and a memory ``emptyDir`` is a directory under ``/dev/shm``.
- ``container`` (nodes run as containers, :mod:`~trainjob.backends.local.containers`): the container engine
  bind-mounts each volume at its ``mountPath`` (``readOnly`` as ``:ro``, a memory ``emptyDir`` as a tmpfs of its
  ``sizeLimit``); nothing is mounted or created at the ``mountPath`` on the host.

Every process gets ``TRAINJOB_MOUNT_<VOLUME>`` (the volume's name upper-cased, other characters
``_``; a second mount of one volume gets ``_2`` ...) with the path at which that mount is visible to it, and
``TRAINJOB_PATH_MAP``, a JSON object from each ``mountPath`` to that path, so a script can find its data without
knowing the mechanism::

    root = json.loads(os.environ.get("TRAINJOB_PATH_MAP", "{}")).get("/data", "/data")
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainjob.errors import ValidationError

if TYPE_CHECKING:
    from trainjob.backends.local.process_specs import ProcessSpec
    from trainjob.runtime.plan import Plan

VOLUMES_ROOT_ENV = "TRAINJOB_VOLUMES_ROOT"
MOUNT_MECHANISM_ENV = "TRAINJOB_MOUNT_MECHANISM"
PATH_MAP_ENV = "TRAINJOB_PATH_MAP"
MOUNT_ENV_PREFIX = "TRAINJOB_MOUNT_"
NAMESPACE = "namespace"
ENV = "env"
#: Nodes that run as containers (:mod:`~trainjob.backends.local.containers`): the engine bind-mounts each volume at
#: its ``mountPath``, as the namespace mechanism does, but nothing is mounted or created on the host's paths.
CONTAINER = "container"
MECHANISMS = ("auto", NAMESPACE, ENV)
SUPPORTED_KINDS = ("persistentVolumeClaim", "hostPath", "emptyDir", "configMap")
#: Where a job's host volumes are kept (read by each node's keeper when it starts the node).
HOST_VOLUMES_FILE = "volumes.json"
SHM = Path("/dev/shm")

_KNOWN_KINDS = (
    *SUPPORTED_KINDS, "secret", "nfs", "csi", "projected", "downwardAPI", "ephemeral", "iscsi", "cephfs", "rbd",
    "glusterfs", "azureFile", "azureDisk", "awsElasticBlockStore", "gcePersistentDisk", "fc", "flexVolume", "flocker",
    "gitRepo", "image", "photonPersistentDisk", "portworxVolume", "quobyte", "scaleIO", "storageos", "vsphereVolume",
)
_CLAIM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_HOST_PATH_TYPES = ("", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice")
_CONFIG_FLAG = "--config-map NAME=PATH (trainjob run/apply) or LocalProcessBackendConfig(config_maps={NAME: PATH})"


@dataclass
class VolumeSettings:
    """Where claims live, which configMaps exist here and how mounts are made: see the module docstring."""

    volumes_root: Path
    config_maps: dict[str, Path] = field(default_factory=dict)
    mechanism: str = "auto"

    @classmethod
    def resolve(cls, home: Path, volumes_root: str | Path | None = None,
                config_maps: Mapping[str, str | Path] | None = None, mechanism: str | None = None) -> VolumeSettings:
        """Settings from a backend's config, falling back to ``$TRAINJOB_VOLUMES_ROOT``, ``$TRAINJOB_MOUNT_MECHANISM``."""
        root = volumes_root or os.environ.get(VOLUMES_ROOT_ENV) or home / "volumes"
        chosen = mechanism or os.environ.get(MOUNT_MECHANISM_ENV) or "auto"
        if chosen not in MECHANISMS:
            raise ValidationError("mount_mechanism", f"must be one of {', '.join(MECHANISMS)}, got {chosen!r}")
        maps = {name: Path(path).expanduser().resolve() for name, path in (config_maps or {}).items()}
        return cls(Path(root).expanduser().resolve(), maps, chosen)


@dataclass
class Mount:
    """One ``volumeMount`` of the trainer container, with the host path behind it."""

    volume: str
    kind: str
    mount_path: str
    #: The host directory (or file); for an ``emptyDir`` the directory holding one ``node-<i>`` per node.
    source: str
    read_only: bool = False
    per_node: bool = False
    sub_path: str = ""
    #: Memory-backed ``emptyDir`` under the namespace mechanism: a tmpfs of this many bytes, no ``source``.
    tmpfs_bytes: int | None = None
    #: The mount is a file (``hostPath`` of a file, a configMap key through ``subPath``), not a directory.
    is_file: bool = False
    #: Environment variable naming where the mount is visible (``TRAINJOB_MOUNT_DATA``).
    env_name: str = ""
    #: An ``emptyDir``'s ``sizeLimit`` in bytes.
    size_limit: int | None = None
    #: A configMap's local file or directory ('' for a missing optional one) and its ``items``.
    config_source: str = ""
    config_items: list[dict[str, str]] = field(default_factory=list)

    def host_path(self, node: int) -> str:
        """Where node ``node`` finds this mount on the host ('' for a tmpfs, which exists only in the node)."""
        if self.tmpfs_bytes is not None:
            return ""
        base = Path(self.source) / f"node-{node}" if self.per_node else Path(self.source)
        return str(base / self.sub_path) if self.sub_path else str(base)


@dataclass
class HostVolumes:
    """The mounts of a job and how they are made; stored as ``volumes.json`` in the job's directory."""

    mechanism: str
    mounts: list[Mount]
    num_nodes: int
    #: Mount points this job created on the host (namespace mechanism), removed with it when no other job uses them.
    created: list[str] = field(default_factory=list)
    #: Directories of this job outside its directory (memory ``emptyDir`` in ``/dev/shm``), removed with it.
    scratch: list[str] = field(default_factory=list)

    def path_map(self, node: int) -> dict[str, str]:
        """``mountPath`` -> where node ``node``'s processes find it."""
        if self.mechanism in (NAMESPACE, CONTAINER):
            return {m.mount_path: m.mount_path for m in self.mounts}
        return {m.mount_path: m.host_path(node) for m in self.mounts}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostVolumes:
        return cls(**{**data, "mounts": [Mount(**m) for m in data["mounts"]]})


# planning (at submit: everything checked, nothing created)


def resolve_host_volumes(plan: Plan, job_dir: Path, settings: VolumeSettings) -> HostVolumes | None:
    """The host volumes of ``plan``'s trainer container; ``None`` when it mounts nothing.

    ``ValidationError`` (naming the volume, what was wrong and what is accepted) for a volume that cannot be
    provided here."""
    from trainjob.runtime.template import pod_spec

    trainer = plan.trainer()
    mounts_spec = trainer.container().volume_mounts
    if not mounts_spec:
        return None
    volumes = {v.get("name"): v for v in pod_spec(trainer.template).get("volumes") or []}
    mechanism = CONTAINER if settings.mechanism == CONTAINER else choose_mechanism(settings.mechanism)
    mounts: list[Mount] = []
    env_names: dict[str, int] = {}
    for index, spec in enumerate(mounts_spec):
        path = f"volumeMounts[{index}]"
        name = spec.get("name")
        if name not in volumes:
            raise ValidationError(f"{path}.name", f"no volume {name!r} in the trainer's pod template "
                                  f"(volumes: {', '.join(map(str, volumes)) or 'none'})")
        mount = _mount(volumes[name], spec, path, plan, job_dir, settings, mechanism)
        count = env_names[name] = env_names.get(name, 0) + 1
        mount.env_name = MOUNT_ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", name.upper()) + (f"_{count}" if count > 1 else "")
        mounts.append(mount)
    _check_memory(mounts, plan.num_nodes, mechanism)
    _check_not_hiding(mounts, job_dir)
    scratch = sorted({str(Path(m.source).parent) for m in mounts if m.kind == "emptyDir" and m.source.startswith(str(SHM))})
    return HostVolumes(mechanism=mechanism, mounts=mounts, num_nodes=plan.num_nodes, scratch=scratch)


def _mount(volume: dict[str, Any], spec: dict[str, Any], path: str, plan: Plan, job_dir: Path,
           settings: VolumeSettings, mechanism: str) -> Mount:
    name = volume["name"]
    where = f"volumes[{name}]"
    mount_path = spec.get("mountPath") or ""
    if not mount_path.startswith("/") or os.path.normpath(mount_path) == "/":
        raise ValidationError(f"{path}.mountPath", f"must be an absolute path other than /, got {mount_path!r}")
    mount_path = os.path.normpath(mount_path)
    if spec.get("subPathExpr"):
        raise ValidationError(f"{path}.subPathExpr", "is not supported by the local backend; use subPath")
    sub_path = spec.get("subPath") or ""
    if sub_path and (sub_path.startswith("/") or ".." in Path(sub_path).parts):
        raise ValidationError(f"{path}.subPath", f"must be a relative path without '..', got {sub_path!r}")
    kinds = [k for k in volume if k != "name"]
    kind = next((k for k in kinds if k in SUPPORTED_KINDS), None)
    if kind is None:
        named = next((k for k in kinds if k in _KNOWN_KINDS), kinds[0] if kinds else "no source")
        raise ValidationError(where, f"{named} volumes are not supported by the local backend; supported locally: "
                              f"{', '.join(SUPPORTED_KINDS)}")
    source = volume[kind] or {}
    read_only = bool(spec.get("readOnly"))
    mount = Mount(volume=name, kind=kind, mount_path=mount_path, source="", read_only=read_only, sub_path=sub_path)
    if kind == "persistentVolumeClaim":
        claim = source.get("claimName") or ""
        if not _CLAIM_NAME.match(claim):
            raise ValidationError(f"{where}.persistentVolumeClaim.claimName",
                                  f"must be a DNS subdomain name (lower-case letters, digits, '-', '.'), got {claim!r}")
        mount.source = str(settings.volumes_root / plan.namespace / claim)
        mount.read_only = read_only or bool(source.get("readOnly"))
    elif kind == "hostPath":
        mount.source = _host_path(source, f"{where}.hostPath")
        exists = Path(mount.source).exists()
        mount.is_file = (exists and not Path(mount.source).is_dir()) or (
            not exists and source.get("type") == "FileOrCreate")
    elif kind == "emptyDir":
        _empty_dir(mount, source, f"{where}.emptyDir", plan, job_dir, mechanism)
    else:
        _config_map(mount, source, f"{where}.configMap", job_dir, settings)
    if sub_path and mount.tmpfs_bytes is not None:
        raise ValidationError(f"{path}.subPath", "is not supported on a memory-backed emptyDir locally")
    if sub_path and kind == "configMap":
        given = Path(mount.config_source) if mount.config_source else None
        mount.is_file = not (given is not None and given.is_dir() and (given / sub_path).is_dir())
    return mount


def _host_path(source: dict[str, Any], where: str) -> str:
    host = source.get("path") or ""
    kind = source.get("type") or ""
    if not host.startswith("/"):
        raise ValidationError(f"{where}.path", f"must be an absolute path, got {host!r}")
    if kind not in _HOST_PATH_TYPES:
        raise ValidationError(f"{where}.type", f"must be one of {', '.join(t or repr('') for t in _HOST_PATH_TYPES)}, "
                              f"got {kind!r}")
    path = Path(host)
    checks = {
        "Directory": (path.is_dir, "an existing directory"),
        "File": (path.is_file, "an existing file"),
        "Socket": (lambda: path.exists() and stat.S_ISSOCK(path.stat().st_mode), "an existing UNIX socket"),
        "CharDevice": (lambda: path.exists() and stat.S_ISCHR(path.stat().st_mode), "an existing character device"),
        "BlockDevice": (lambda: path.exists() and stat.S_ISBLK(path.stat().st_mode), "an existing block device"),
        "DirectoryOrCreate": (lambda: not path.exists() or path.is_dir(), "a directory or nothing (it is created)"),
        "FileOrCreate": (lambda: (not path.exists() and path.parent.is_dir()) or path.is_file(),
                         "a file, or nothing in an existing directory (it is created)"),
    }
    if kind in checks:
        check, wanted = checks[kind]
        if not check():
            found = "nothing" if not path.exists() else "a directory" if path.is_dir() else "something else"
            raise ValidationError(f"{where}.path", f"type {kind} needs {wanted} at {host}; found {found}")
    elif not path.exists():
        raise ValidationError(f"{where}.path", f"{host} does not exist (set type: DirectoryOrCreate to create it)")
    return os.path.normpath(host)


def _empty_dir(mount: Mount, source: dict[str, Any], where: str, plan: Plan, job_dir: Path, mechanism: str) -> None:
    from trainjob.api.quantity import QuantityError, parse_quantity

    medium = source.get("medium") or ""
    if medium not in ("", "Memory"):
        raise ValidationError(f"{where}.medium", f"must be '' (disk) or Memory, got {medium!r}")
    limit: int | None = None
    if source.get("sizeLimit") is not None:
        try:
            limit = int(parse_quantity(source["sizeLimit"]))
        except QuantityError as exc:
            raise ValidationError(f"{where}.sizeLimit", str(exc)) from None
        if limit <= 0:
            raise ValidationError(f"{where}.sizeLimit", f"must be more than 0, got {source['sizeLimit']!r}")
    mount.per_node, mount.size_limit = True, limit
    if medium == "Memory" and mechanism in (NAMESPACE, CONTAINER):
        mount.tmpfs_bytes = limit if limit is not None else memory_bytes()
    elif medium == "Memory":  # unique per job: a job of the same name may still be being deleted
        mount.source = str(SHM / f"trainjob-{plan.job_name}-{uuid.uuid4().hex[:8]}" / mount.volume)
    else:
        mount.source = str(job_dir / "volumes" / "emptyDir" / mount.volume)


def _config_map(mount: Mount, source: dict[str, Any], where: str, job_dir: Path, settings: VolumeSettings) -> None:
    name = source.get("name") or ""
    mount.read_only = True
    mount.source = str(job_dir / "volumes" / "configMap" / mount.volume)
    given = settings.config_maps.get(name)
    if given is None:
        if source.get("optional"):
            return
        known = ", ".join(sorted(settings.config_maps)) or "none"
        raise ValidationError(f"{where}.name", f"configMap {name!r} was not given; give its file or directory with "
                              f"{_CONFIG_FLAG} (given: {known})")
    if not given.exists():
        raise ValidationError(f"{where}.name", f"configMap {name!r} is {given}, which does not exist")
    keys = sorted(p.name for p in given.iterdir() if p.is_file()) if given.is_dir() else [given.name]
    items = source.get("items") or []
    for item in items:
        key, target = item.get("key", ""), item.get("path", "")
        if key not in keys:
            raise ValidationError(f"{where}.items", f"configMap {name!r} ({given}) has no key {key!r} (keys: "
                                  f"{', '.join(keys) or 'none'})")
        if not target or target.startswith("/") or ".." in Path(target).parts:
            raise ValidationError(f"{where}.items", f"path must be relative without '..', got {target!r}")
    mount.config_source, mount.config_items = str(given), list(items)


def _check_memory(mounts: list[Mount], num_nodes: int, mechanism: str) -> None:
    from trainjob.api.quantity import format_quantity

    memory = [m for m in mounts if m.kind == "emptyDir" and (m.tmpfs_bytes is not None or m.source.startswith(str(SHM)))]
    if not memory:
        return
    if mechanism in (NAMESPACE, CONTAINER):
        capacity, what = memory_bytes(), "memory on this machine"
    else:
        usage = os.statvfs(SHM)
        capacity, what = usage.f_bavail * usage.f_frsize, f"space free in {SHM}"
    for mount in memory:
        limit = mount.size_limit
        if limit is None:
            continue
        if limit * num_nodes > capacity:
            fits = _gib(capacity // num_nodes)
            raise ValidationError(
                f"volumes[{mount.volume}].emptyDir.sizeLimit",
                f"{num_nodes} node(s) x {format_quantity(limit)} ({_gib(limit * num_nodes)}) exceeds the "
                f"{_gib(capacity)} of {what}; at most {fits} per node fits",
            )


def _check_not_hiding(mounts: list[Mount], job_dir: Path) -> None:
    """A mount over the job's directory or this Python environment would hide what the node needs to start."""
    needed = {"the job's directory": job_dir, "this Python environment": Path(sys.prefix),
              "the trainjob package": Path(__file__).resolve().parents[3]}
    for mount in mounts:
        for what, path in needed.items():
            resolved = str(path.resolve())
            if resolved == mount.mount_path or resolved.startswith(mount.mount_path.rstrip("/") + "/"):
                raise ValidationError(f"volumes[{mount.volume}]", f"mountPath {mount.mount_path} would hide {what} "
                                      f"({resolved}) from the node; mount it somewhere else")


def memory_bytes() -> int:
    """This machine's memory (``MemTotal``)."""
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


def _gib(value: int | Decimal) -> str:
    return f"{Decimal(value) / 2**30:.1f}Gi"


def choose_mechanism(requested: str) -> str:
    """``namespace`` or ``env`` for ``requested`` (``auto`` picks ``namespace`` where mount namespaces work)."""
    if requested == ENV:
        return ENV
    problem = namespace_problem()
    if problem is None:
        return NAMESPACE
    if requested == NAMESPACE:
        raise ValidationError("mount_mechanism", f"namespace mounts are not available here: {problem}; use env")
    return ENV


@functools.cache
def namespace_problem() -> str | None:
    """Why this process cannot give nodes private mount namespaces, or ``None`` when it can (tried once)."""
    if os.geteuid() != 0:
        return "not running as root"
    probe = ("import ctypes,os,sys; libc=ctypes.CDLL(None, use_errno=True); "
             "sys.exit(0 if libc.unshare(0x20000) == 0 and libc.mount(None, b'/', None, (1<<14)|(1<<18), None) == 0 "
             "else 1)")
    try:
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot try unshare ({exc})"
    return None if result.returncode == 0 else "unshare(CLONE_NEWNS) is not permitted"


# at submit: applying the host volumes to the process spec


def apply_to_process_spec(host_volumes: HostVolumes, spec: ProcessSpec) -> None:
    """Give every node its ``TRAINJOB_MOUNT_*`` and ``TRAINJOB_PATH_MAP``; under ``env``, rewrite the command,
    the pod's env values and the working directory that start with a ``mountPath``; note ``VolumesMounted``."""
    for node in spec.nodes:
        mapping = host_volumes.path_map(node.index)
        if host_volumes.mechanism == ENV:
            node.command = [rewrite_path(arg, mapping) for arg in node.command]
            node.env = {k: v if k.startswith("TRAINJOB_") else rewrite_path(v, mapping) for k, v in node.env.items()}
        for mount in host_volumes.mounts:
            node.env[mount.env_name] = mapping[mount.mount_path] if mount.tmpfs_bytes is None else mount.mount_path
        node.env[PATH_MAP_ENV] = json.dumps(mapping if host_volumes.mechanism == ENV else
                                            {m.mount_path: m.mount_path for m in host_volumes.mounts})
    if host_volumes.mechanism == ENV:
        spec.cwd = rewrite_path(spec.cwd, host_volumes.path_map(0))
    spec.notes.append(("VolumesMounted", describe(host_volumes)))


def rewrite_path(value: str, mapping: Mapping[str, str]) -> str:
    """``value`` with a leading ``mountPath`` (also after ``--opt=``) replaced by its host path; the longest wins."""
    head, sep, tail = value.partition("=") if value.startswith("-") else ("", "", value)
    for mount_path in sorted(mapping, key=len, reverse=True):
        if tail == mount_path or tail.startswith(mount_path.rstrip("/") + "/"):
            return head + sep + mapping[mount_path] + tail[len(mount_path):]
    return value


def host_command(host_volumes: HostVolumes | None, command: list[str], cwd: str) -> tuple[list[str], str]:
    """``command`` and ``cwd`` as node 0's files are found from here (to check that its script exists)."""
    if host_volumes is None:
        return command, cwd
    mapping = {m.mount_path: m.host_path(0) for m in host_volumes.mounts if m.tmpfs_bytes is None}
    return [rewrite_path(arg, mapping) for arg in command], rewrite_path(cwd, mapping)


def describe(host_volumes: HostVolumes) -> str:
    """The ``VolumesMounted`` event: the mechanism, then each volume -> host path at its mountPath."""
    how = {NAMESPACE: "namespace (bind mounts in a private mount namespace per node)",
           CONTAINER: "container (bind mounts of the container engine)",
           ENV: f"env (paths rewritten; {PATH_MAP_ENV} and {MOUNT_ENV_PREFIX}* name them; readOnly and sizeLimit "
                "not enforced)"}[host_volumes.mechanism]
    parts = []
    for m in host_volumes.mounts:
        if m.tmpfs_bytes is not None:
            from trainjob.api.quantity import format_quantity

            target = f"tmpfs {format_quantity(m.tmpfs_bytes)} per node"
        elif m.per_node:
            target = str(Path(m.source) / "node-<i>" / m.sub_path) if m.sub_path else str(Path(m.source) / "node-<i>")
        else:
            target = m.host_path(0)
        parts.append(f"{m.volume} ({m.kind}) -> {target} at {m.mount_path}{' (ro)' if m.read_only else ''}")
    return f"{how}: " + "; ".join(parts)


# creating and removing what the plan names


def prepare(host_volumes: HostVolumes, job_dir: Path) -> None:
    """Create what the plan's mounts need (claim directories, emptyDirs, configMap copies, mount points), then
    store the plan in the job's directory for the nodes' keepers."""
    try:  # stored however far this gets, so that deleting the job removes what was created
        for scratch in host_volumes.scratch:
            Path(scratch).mkdir(parents=True, exist_ok=True)
        for mount in host_volumes.mounts:
            _create_source(mount, host_volumes.num_nodes)
        if host_volumes.mechanism == NAMESPACE:
            for mount in sorted(host_volumes.mounts, key=lambda m: m.mount_path.count("/")):
                created = _make_mount_point(Path(mount.mount_path), mount.is_file)
                if created is not None and str(created) not in host_volumes.created:
                    host_volumes.created.append(str(created))
    finally:
        (job_dir / HOST_VOLUMES_FILE).write_text(json.dumps(host_volumes.to_dict(), indent=1), encoding="utf-8")


def _create_source(mount: Mount, num_nodes: int) -> None:
    if mount.kind == "persistentVolumeClaim":
        Path(mount.source).mkdir(parents=True, exist_ok=True)
    elif mount.kind == "hostPath":
        _create_host_path(mount)
    elif mount.kind == "emptyDir" and mount.tmpfs_bytes is None:
        for node in range(num_nodes):
            (Path(mount.source) / f"node-{node}").mkdir(parents=True, exist_ok=True)
    elif mount.kind == "configMap":
        _copy_config_map(mount)
    if mount.sub_path and mount.tmpfs_bytes is None and not mount.is_file:
        for node in range(num_nodes if mount.per_node else 1):
            Path(mount.host_path(node)).mkdir(parents=True, exist_ok=True)


def _create_host_path(mount: Mount) -> None:
    path = Path(mount.source)
    if path.exists():
        return
    if mount.is_file:  # FileOrCreate
        path.touch(mode=0o644)
    else:  # DirectoryOrCreate
        path.mkdir(mode=0o755, parents=True)


def _copy_config_map(mount: Mount) -> None:
    target = Path(mount.source)
    target.mkdir(parents=True, exist_ok=True)
    if not mount.config_source:
        return
    given = Path(mount.config_source)
    if mount.config_items:
        for item in mount.config_items:
            copy = target / item["path"]
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(given / item["key"] if given.is_dir() else given, copy)
    elif given.is_dir():
        shutil.copytree(given, target, dirs_exist_ok=True)
    else:
        shutil.copyfile(given, target / given.name)


def _make_mount_point(path: Path, is_file: bool) -> Path | None:
    """Create ``path`` (an empty file or directory) where it is missing; the topmost path created, if any."""
    if path.exists() or path.is_symlink():
        return None
    top = path
    while not top.parent.exists():
        top = top.parent
    if is_file:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    else:
        path.mkdir(parents=True)
    return top


def read_host_volumes(job_dir: Path) -> HostVolumes | None:
    """The job's stored host volumes, or ``None`` when it mounts nothing."""
    try:
        return HostVolumes.from_dict(json.loads((job_dir / HOST_VOLUMES_FILE).read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None


def release(job_dir: Path, jobs_dir: Path) -> None:
    """Remove what the job made outside its directory (memory emptyDirs in ``/dev/shm``, mount points it created
    that no other job names); claims and host paths are kept. Its directory (and emptyDirs) go with the job."""
    host_volumes = read_host_volumes(job_dir)
    if host_volumes is None:
        return
    for scratch in host_volumes.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    if not host_volumes.created:
        return
    in_use: set[str] = set()
    for other in jobs_dir.glob(f"*/{HOST_VOLUMES_FILE}"):
        if other.parent == job_dir:
            continue
        other_plan = read_host_volumes(other.parent)
        if other_plan is not None:
            in_use.update(other_plan.created)
            in_use.update(m.mount_path for m in other_plan.mounts)
    for created in sorted(host_volumes.created, key=len, reverse=True):
        if any(p == created or p.startswith(created + "/") for p in in_use):
            continue
        _remove_empty(Path(created))


def _remove_empty(path: Path) -> None:
    """Remove ``path`` if it holds nothing: empty directories bottom-up, an empty file; never anything with data."""
    try:
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                _remove_empty(child)
            path.rmdir()
        elif path.is_file() and path.stat().st_size == 0:
            path.unlink()
    except OSError:
        pass  # in use or not empty: left as it is
