"""A small real filesystem for the tests of what a full disk does: a tmpfs of a given size, mounted at a fresh
directory (as root) and always unmounted afterwards, so no mount outlives the test::

    with small_tmpfs(tmp_path / "small", 10 << 20) as mounted:
        ...  # writes past 10 MiB fail with ENOSPC
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

_MNT_DETACH = 2


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


@contextlib.contextmanager
def small_tmpfs(target: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` at ``target`` (created); skips the test where it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    target.mkdir(parents=True, exist_ok=True)
    libc = _libc()
    if libc.mount(b"tmpfs", bytes(target), b"tmpfs", 0, f"size={size_bytes}".encode()) != 0:
        pytest.skip(f"cannot mount a tmpfs here: {os.strerror(ctypes.get_errno())}")
    try:
        yield target
    finally:
        if libc.umount2(bytes(target), 0) != 0:  # still in use: detach it
            libc.umount2(bytes(target), _MNT_DETACH)


def fill(directory: Path, leave_bytes: int = 0) -> Path:
    """Fill the filesystem of ``directory`` with one file until at most ``leave_bytes`` are free; the file."""
    filler = directory / "filler"
    with filler.open("wb") as out:
        chunk = b"\0" * (1 << 16)
        while True:
            stat = os.statvfs(directory)
            free = stat.f_bavail * stat.f_frsize
            if free <= leave_bytes:
                break
            try:
                out.write(chunk[: max(1, min(len(chunk), free - leave_bytes))])
                out.flush()
            except OSError:
                break
    return filler
