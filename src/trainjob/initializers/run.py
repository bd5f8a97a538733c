"""One initializer run: list the source, reuse or download it, put it at the target.

::

    list (one request: the Hub commit, or the S3 listing)
      -> cache set and the entry there?   link its files into the target              ("from the cache")
      -> cache set, no entry              download into the entry's staging, verify, publish, link
      -> no cache                         download into a staging folder beside the target, verify, rename
    the target's marker (``.<name>.trainjob.json`` beside it) says what it holds; a run that finds the same
    source and version there already does nothing

A listing or transfer that breaks off is tried again (:data:`ATTEMPTS` times, with back-off); a refusal is not.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainjob.errors import DownloadError
from trainjob.initializers.cache import DataCache, cache_key
from trainjob.initializers.config import HF_SCHEME, InitializerConfig
from trainjob.initializers.transfer import (
    Listing,
    Progress,
    disk_full_error,
    human_bytes,
    is_disk_full,
    link_tree,
    move_into,
    remove_tree,
    target_entries,
    verify_tree,
)

#: Tries of a listing or download that breaks off (a dropped connection, a 5xx).
ATTEMPTS = 3
BACKOFF_SECONDS = 1.0


class Source(Protocol):
    """A remote folder: :meth:`list` names its files (sizes, checksums, version); :meth:`fetch` brings them into a
    staging folder, each one's size and checksum checked as it lands."""

    def list(self) -> Listing: ...
    def fetch(self, listing: Listing, staging: Path) -> None: ...


def source_for(config: InitializerConfig) -> Source:
    if config.source.scheme == HF_SCHEME:
        from trainjob.initializers.huggingface import HuggingFaceSource

        return HuggingFaceSource(config)
    from trainjob.initializers.s3 import S3Source

    return S3Source(config)


@dataclass
class Outcome:
    """What a run did: ``how`` is ``downloaded``, ``cached`` or ``present``."""

    how: str
    listing: Listing
    target: Path
    seconds: float
    key: str = ""

    def summary(self, config: InitializerConfig) -> str:
        size = f"{len(self.listing.files)} files, {human_bytes(self.listing.total_bytes)}"
        said = {"downloaded": f"downloaded in {self.seconds:.1f} s",
                "cached": "from the cache (downloaded by an earlier job)",
                "present": "already there"}[self.how]
        return f"{config.kind} {config.source.uri} at {self.listing.version[:12]} ({size}) {said}: {self.target}"


def marker_path(target: Path) -> Path:
    return target.parent / f".{target.name}.trainjob.json"


def initialize(config: InitializerConfig, log: Callable[[str], None] | None = None) -> Outcome:
    """Fetch ``config``'s source into its target; ``DownloadError`` naming the source and the server's answer."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    started = time.monotonic()
    target = Path(config.target)
    source = source_for(config)
    progress = Progress(config.kind + "-initializer", config.source.uri, config.progress_file, say)
    progress.write()
    say(f"listing {config.where()}")
    listing = _attempts(source.list, say)
    key = cache_key(config, listing)
    say(f"{config.source.uri}: version {listing.version[:12]}, {len(listing.files)} files, "
        f"{human_bytes(listing.total_bytes)}")
    if _marker_says(target, key):
        progress.set(phase="done", done_bytes=listing.total_bytes, total_bytes=listing.total_bytes)
        return Outcome("present", listing, target, time.monotonic() - started, key)
    _check_target_free(target, config)
    if config.cache_dir:
        cache = DataCache(config.cache_dir)
        with cache.locked(key):
            entry = cache.get(key)
            how = "cached"
            if entry is None:
                staging = cache.staging(key)
                _download(source, listing, staging, progress, config, say)
                entry = cache.publish(key, config, listing)
                how = "downloaded"
            else:
                progress.set(phase="cached", total_bytes=listing.total_bytes, done_bytes=listing.total_bytes,
                             files=len(listing.files))
            _clear(target)
            linked = link_tree(Path(entry.path), target)
        say(f"{linked} {len(listing.files)} files from the cache entry {key[:12]} ({entry.path})")
    else:
        staging = target.parent / f".{target.name}.{key[:16]}.partial"
        staging.mkdir(parents=True, exist_ok=True)
        _download(source, listing, staging, progress, config, say)
        _clear(target)
        move_into(staging, target)
        how = "downloaded"
    _write_marker(target, config, listing, key)
    progress.set(phase="done", done_bytes=listing.total_bytes)
    return Outcome(how, listing, target, time.monotonic() - started, key)


def _download(source: Source, listing: Listing, staging: Path, progress: Progress, config: InitializerConfig,
              say: Callable[[str], None]) -> None:
    where = config.where()
    try:
        with progress.watching(staging, listing):
            _attempts(lambda: (source.fetch(listing, staging), verify_tree(staging, listing, where)), say)
    except OSError as exc:
        if is_disk_full(exc):
            remove_tree(staging)
            raise disk_full_error(exc, staging, listing, where) from exc
        raise
    except DownloadError:
        if not _resumable(staging):
            remove_tree(staging)
        raise


def _resumable(staging: Path) -> bool:
    """Whether a failed download's staging folder holds verified files worth keeping for the next run."""
    return any(not name.endswith((".part", ".incomplete")) for _, _, names in os.walk(staging) for name in names)


def _attempts(call: Callable[[], object], say: Callable[[str], None]):  # type: ignore[no-untyped-def]
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return call()
        except DownloadError as exc:
            if not exc.retryable or attempt == ATTEMPTS:
                raise
            say(f"{exc}; trying again ({attempt + 1} of {ATTEMPTS})")
            time.sleep(BACKOFF_SECONDS * attempt)
    raise AssertionError("unreachable")


def _marker_says(target: Path, key: str) -> bool:
    try:
        return json.loads(marker_path(target).read_text()).get("key") == key and target.exists()
    except (OSError, ValueError):
        return False


def _check_target_free(target: Path, config: InitializerConfig) -> None:
    """A target that holds files no initializer put there is left alone: the job fails, naming it."""
    if target.is_symlink() or not target_entries(target) or marker_path(target).exists():
        return
    raise DownloadError(f"{config.where()}: the target {target} already holds files ({', '.join(target_entries(target)[:5])}"
                        f"...) that no initializer wrote; empty it or point TRAINJOB_INITIALIZER_TARGET elsewhere")


def _clear(target: Path) -> None:
    """Empty a target an earlier initializer filled (another source or version) before the new files go in."""
    if target.is_symlink():
        target.unlink()
    elif target.exists():
        for name in target_entries(target):
            remove_tree(target / name)


def _write_marker(target: Path, config: InitializerConfig, listing: Listing, key: str) -> None:
    data = {"uri": config.source.uri, "kind": config.kind, "version": listing.version, "key": key,
            "files": len(listing.files), "bytes": listing.total_bytes, "written": time.time()}
    tmp = marker_path(target).with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, marker_path(target))
