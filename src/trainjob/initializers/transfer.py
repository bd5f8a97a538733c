"""What every source shares: the listing a download starts from, verifying what arrived, progress, and putting a
finished download in place.

A download goes into a *staging* folder whose name is stable for the source and version, so an interrupted run
that is started again finds the files it already verified and fetches only the rest (a file half-written when it
stopped is fetched again from its start). Each file is written aside (``NAME.part`` or the Hub client's
``.incomplete``), its size (and checksum, when the source gives one) checked, and only then renamed to its name;
the staging folder becomes the target (or the cache entry) in one rename. A half-written file never carries the
name of a complete one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainjob.errors import DownloadError

#: The Hub client's per-download bookkeeping inside a ``local_dir``; dropped once the files are verified.
HUB_METADATA_DIR = ".cache"
PART_SUFFIX = ".part"
#: How often progress is written to its file, and logged.
PROGRESS_WRITE_SECONDS = 1.0
PROGRESS_LOG_SECONDS = 5.0


@dataclass(frozen=True)
class RemoteFile:
    """One file of a source: its path under the target, size, and the checksum the source vouches for."""

    path: str
    size: int
    #: ``("md5", hex)`` (an S3 single-part ETag), ``("sha256", hex)`` (a Hub LFS file) or ``None``.
    checksum: tuple[str, str] | None = None
    #: The source's own name for it where that differs from ``path`` (an S3 key).
    key: str | None = None


@dataclass(frozen=True)
class Listing:
    """What a source holds at one version: ``version`` is the Hub commit, or a digest of the S3 objects' ETags."""

    version: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def human_bytes(count: float) -> str:
    """``1.5 GB``, ``512.0 kB``: decimal units, as download tools print them."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def file_digest(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verify_file(path: Path, remote: RemoteFile, where: str) -> None:
    """``DownloadError`` (retryable) unless ``path`` has the size, and checksum, that ``remote`` promises."""
    size = path.stat().st_size
    if size != remote.size:
        raise DownloadError(f"{where}: {remote.path} arrived with {size} bytes, the source lists {remote.size}",
                            retryable=True)
    if remote.checksum is not None:
        algorithm, expected = remote.checksum
        actual = file_digest(path, algorithm)
        if actual != expected:
            raise DownloadError(f"{where}: {remote.path} has {algorithm} {actual}, the source lists {expected}",
                                retryable=True)


def is_verified(path: Path, remote: RemoteFile) -> bool:
    """Whether a file left by an earlier run is complete (its size; the checksum is checked again at the end)."""
    try:
        return path.is_file() and path.stat().st_size == remote.size
    except OSError:
        return False


def verify_tree(staging: Path, listing: Listing, where: str) -> None:
    """Every listed file is in ``staging`` with its size (the sources check each file's checksum as it lands); the
    Hub client's bookkeeping is removed."""
    shutil.rmtree(staging / HUB_METADATA_DIR, ignore_errors=True)
    for remote in listing.files:
        path = staging / remote.path
        if not path.is_file() or path.stat().st_size != remote.size:
            raise DownloadError(f"{where}: {remote.path} is missing or incomplete after the download",
                                retryable=True)


def disk_full_error(exc: OSError, staging: Path, listing: Listing, where: str) -> DownloadError:
    """The message for a disk that filled during a download: the path, what the source needs and what was free."""
    free = shutil.disk_usage(staging.parent if staging.parent.exists() else Path("/")).free
    return DownloadError(f"{where}: no space left on device while writing {exc.filename or staging} (the source "
                         f"is {human_bytes(listing.total_bytes)}, {human_bytes(free)} free there); nothing was left "
                         "in place", retryable=False)


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


# putting a download in place


def make_read_only(tree: Path) -> None:
    """Files of a shared download are read-only: a job that writes into its dataset gets an error, not a change
    every later job would see."""
    for root, _, names in os.walk(tree):
        for name in names:
            path = Path(root) / name
            with contextlib.suppress(OSError):
                path.chmod(path.stat().st_mode & 0o555)


def make_writable(tree: Path) -> None:
    for root, dirs, names in os.walk(tree):
        for name in [*dirs, *names]:
            path = Path(root) / name
            with contextlib.suppress(OSError):
                path.chmod(path.stat().st_mode | 0o200)


def remove_tree(tree: Path) -> None:
    if tree.is_symlink() or tree.is_file():
        tree.unlink(missing_ok=True)
    elif tree.exists():
        make_writable(tree)
        shutil.rmtree(tree, ignore_errors=True)


def link_tree(source: Path, target: Path) -> str:
    """Fill ``target`` with ``source``'s files as hard links (no copy; the cache's read-only files are shared),
    or copies where the two are on different filesystems; how, in a word."""
    how = "linked"
    target.mkdir(parents=True, exist_ok=True)
    for root, dirs, names in os.walk(source):
        relative = Path(root).relative_to(source)
        for name in dirs:
            (target / relative / name).mkdir(exist_ok=True)
        for name in names:
            destination = target / relative / name
            destination.unlink(missing_ok=True)
            try:
                os.link(Path(root) / name, destination)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
                shutil.copy2(Path(root) / name, destination)
                how = "copied"
    return how


def move_into(staging: Path, target: Path) -> None:
    """``staging`` becomes ``target``: one rename, or, where ``target`` is a folder already (a volume mounted
    there), each entry moved into it."""
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, target)
        return
    for entry in staging.iterdir():
        destination = target / entry.name
        if destination.exists() or destination.is_symlink():
            remove_tree(destination)
        os.rename(entry, destination)
    staging.rmdir()


def target_entries(target: Path) -> list[str]:
    """What a target folder already holds, ignoring what a fresh filesystem has (``lost+found``)."""
    if not target.is_dir():
        return []
    return sorted(name for name in os.listdir(target) if name != "lost+found")


# progress


@dataclass
class ProgressState:
    """What the progress file holds: read by the local supervisor for the job's message."""

    step: str
    uri: str
    phase: str = "listing"  # listing | downloading | cached | done
    total_bytes: int = 0
    done_bytes: int = 0
    files: int = 0
    bytes_per_second: float = 0.0
    updated: float = field(default_factory=time.time)

    def line(self) -> str:
        """``45% of 1.0 GB (450.0 MB, 120.0 MB/s, 10 files) from hf://...``"""
        if self.phase == "listing":
            return f"listing {self.uri}"
        if self.phase == "cached":
            return f"{human_bytes(self.total_bytes)} ({self.files} files) from the cache: {self.uri}"
        percent = 100 * self.done_bytes / self.total_bytes if self.total_bytes else 100.0
        rate = f", {human_bytes(self.bytes_per_second)}/s" if self.bytes_per_second else ""
        return (f"{percent:.0f}% of {human_bytes(self.total_bytes)} ({human_bytes(self.done_bytes)}{rate}, "
                f"{self.files} files) from {self.uri}")


class Progress:
    """Watches a staging folder grow and says so: a line in the log every few seconds, a JSON file every second.

    Sizing the folder (the Hub client's ``.incomplete`` files and the ``.part`` files included) works the same
    for every source, so no source needs a callback of its own."""

    def __init__(self, step: str, uri: str, progress_file: str | None,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
        self.state = ProgressState(step=step, uri=uri)
        self.file = Path(progress_file) if progress_file else None
        self.log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_log = 0.0

    def write(self) -> None:
        if self.file is None:
            return
        self.state.updated = time.time()
        tmp = self.file.with_name(self.file.name + ".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(asdict(self.state)))
            os.replace(tmp, self.file)

    def set(self, **changes: object) -> None:
        for name, value in changes.items():
            setattr(self.state, name, value)
        self.write()

    @contextlib.contextmanager
    def watching(self, staging: Path, listing: Listing) -> Iterator[None]:
        """Report ``staging``'s growth towards ``listing``'s size while the block runs, then a last line."""
        self.set(phase="downloading", total_bytes=listing.total_bytes, files=len(listing.files), done_bytes=0)
        started = time.monotonic()
        baseline = folder_bytes(staging)  # what an earlier, interrupted run left
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, args=(staging, started, baseline), daemon=True)
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join()
        self._sample(staging, started, baseline, final=True)

    def _watch(self, staging: Path, started: float, baseline: int) -> None:
        while not self._stop.wait(PROGRESS_WRITE_SECONDS):
            self._sample(staging, started, baseline)

    def _sample(self, staging: Path, started: float, baseline: int, final: bool = False) -> None:
        done = min(folder_bytes(staging), self.state.total_bytes)
        elapsed = max(time.monotonic() - started, 1e-6)
        self.set(done_bytes=done, bytes_per_second=max(done - baseline, 0) / elapsed)
        now = time.monotonic()
        if final or now - self._last_log >= PROGRESS_LOG_SECONDS:
            self._last_log = now
            self.log(self.state.line())


def folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
