"""A node's private mount namespace: its volumes bind-mounted at their ``mountPath``, invisible to the host.

A node keeper (:mod:`~trainjob.backends.local.node_keeper`) starting a job with the ``namespace`` mechanism
(:mod:`~trainjob.backends.local.volumes`) calls :func:`enter_node_namespace` in the node's process between fork and
exec. That process, and everything it starts (torchrun, the ranks), then lives in a mount namespace of its own:

1. ``unshare(CLONE_NEWNS)``, then ``/`` made recursively private (``mount --make-rprivate /``), so no mount made
   here propagates to the host, and none of the host's later mounts here;
2. each mount, parents before children: a bind mount of the host path (recursive; remounted read-only for
   ``readOnly``), or a tmpfs of ``sizeLimit`` for a memory-backed ``emptyDir`` (``/dev/shm`` included);
3. the working directory entered again, in case it lies under a mount.

The namespace ends when the last process in it does, taking its mounts along: a stopped or deleted job leaves no
mount behind. Nothing here allocates much or starts threads, as code between fork and exec must not.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from trainjob.backends.local.volumes import NAMESPACE, HostVolumes, read_host_volumes

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
#: The exit status of a node whose mounts could not be made (the reason is in its log).
MOUNT_FAILED_EXIT_CODE = 126

_libc = ctypes.CDLL(None, use_errno=True)


class MountError(OSError):
    """A mount of the node's namespace failed; the message names it."""


def node_mounts(job_dir: Path, node: int) -> list[tuple[str, str, bool, int | None, bool]] | None:
    """``(mountPath, host path, read-only, tmpfs bytes, is file)`` per mount of node ``node`` when its job uses the
    namespace mechanism, parents first; ``None`` otherwise."""
    host_volumes: HostVolumes | None = read_host_volumes(job_dir)
    if host_volumes is None or host_volumes.mechanism != NAMESPACE:
        return None
    mounts = sorted(host_volumes.mounts, key=lambda m: m.mount_path.count("/"))
    return [(m.mount_path, m.host_path(node), m.read_only, m.tmpfs_bytes, m.is_file) for m in mounts]


def enter_node_namespace(mounts: list[tuple[str, str, bool, int | None, bool]], cwd: str | None) -> None:
    """Move this process into a private mount namespace with ``mounts`` made (see the module docstring)."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        _fail("unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None, "make / private")
    for target, source, read_only, tmpfs_bytes, is_file in mounts:
        _ensure_mount_point(target, is_file)
        if tmpfs_bytes is not None:
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},mode=1777",
                   f"tmpfs of {tmpfs_bytes} bytes at {target}")
            continue
        _mount(source, target, None, MS_BIND | MS_REC, None, f"bind {source} at {target}")
        if read_only:
            _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None, f"remount {target} read-only")
    if cwd:
        os.chdir(cwd)


def _ensure_mount_point(target: str, is_file: bool) -> None:
    """Mount points inside another mount (``/data/cache`` in the claim at ``/data``) are made as the kubelet makes
    them; the job's own top-level mount points were created at submit."""
    if os.path.lexists(target):
        return
    if is_file:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    else:
        os.makedirs(target, exist_ok=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None, what: str) -> None:
    if _libc.mount(_bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data)) != 0:
        _fail(what)


def _bytes(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def _fail(what: str) -> None:
    errno = ctypes.get_errno()
    raise MountError(errno, f"{what}: {os.strerror(errno)}")


def preexec(mounts: list[tuple[str, str, bool, int | None, bool]], cwd: str | None, cpus: list[int]) -> None:
    """What runs in the node's process before exec: CPU affinity, then its namespace. A failure is written to the
    node's log (its stderr) and ends the process with :data:`MOUNT_FAILED_EXIT_CODE`."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        enter_node_namespace(mounts, cwd)
    except OSError as exc:
        os.write(2, f"[trainjob] cannot mount the node's volumes: {exc.strerror or exc}\n".encode())
        os._exit(MOUNT_FAILED_EXIT_CODE)
