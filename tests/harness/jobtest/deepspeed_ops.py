"""DeepSpeed's CPU ops for the DeepSpeed tests, built ahead once per environment instead of in every run.

DeepSpeed compiles the ops it did not prebuild (CPU Adam, fused Adam, shared-memory comm) on first use, into
``TORCH_EXTENSIONS_DIR`` (``~/.cache/torch_extensions`` by default): about 1.5 minutes on 2 cores, every run when
the folder is a fresh temporary one, and slower still inside the tests, beside the jobs. ``bash scripts/test.sh``
(not ``--fast``) builds them first, like the test cluster's components, into a cache folder named after
everything the build depends on (this is ``python -m jobtest.deepspeed_ops``); the tests use that folder when it
is complete and compile into a temporary one otherwise.

A build made by another ninja, compiler or interpreter (the build's include paths name the ``.venv``), or against
another installation of DeepSpeed or torch (another version, or the same one installed anew, as a fresh clone's
``.venv`` does: its sources and headers are then newer than the build, and ninja would rebuild it), gets a folder
of its own, so the jobs' ninja finds the build up to date and never rebuilds it. Other environments' builds are
kept for a while (two checkouts side by side each keep theirs): the two last used, each until unused for two
weeks.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: The ops the DeepSpeed configs of examples/deepspeed load on the CPU accelerator.
OPS = ("CPUAdamBuilder", "FusedAdamBuilder", "ShareMemCommBuilder")
READY = "ready"
#: Another environment's build (another checkout's ``.venv``, an older DeepSpeed) is removed once unused this long.
KEEP_UNUSED_S = 14 * 24 * 3600
#: ... and at most this many others are kept (about 100 MB each), the most recently used.
KEEP_OTHERS = 2


def _first_line(command: list[str]) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "missing"
    return out.splitlines()[0] if out else ""


def _installed(package: str) -> int:
    """When ``package`` was installed: its ``__init__.py``'s modification time (pip writes every file anew)."""
    spec = importlib.util.find_spec(package)  # found, not imported
    return os.stat(spec.origin).st_mtime_ns if spec is not None and spec.origin else 0


def build_env() -> dict[str, str]:
    """The environment DeepSpeed builds in: the CPU accelerator, and this interpreter's ``bin`` (its ninja) first
    on ``PATH``, as it is for the jobs the tests run."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {"DS_ACCELERATOR": "cpu", "PATH": path}


def cache_dir() -> Path:
    """The folder for this environment's build: ``~/.cache/trainjob/torch-extensions/KEY``."""
    ninja = shutil.which("ninja", path=build_env()["PATH"]) or "missing"
    versions = {
        "python": sys.version,
        "prefix": sys.prefix,
        # Versions, and when each was installed: ninja rebuilds what is older than its sources and headers, and a
        # reinstall (a fresh .venv, as in a new clone) writes them anew.
        "torch": [importlib.metadata.version("torch"), _installed("torch")],
        "deepspeed": [importlib.metadata.version("deepspeed"), _installed("deepspeed")],
        "ninja": [ninja, _first_line([ninja, "--version"])],
        "c++": _first_line([os.environ.get("CXX", "c++"), "--version"]),
    }
    key = hashlib.sha256(json.dumps(versions, sort_keys=True).encode()).hexdigest()[:16]
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "trainjob" / "torch-extensions" / key


def ready_dir() -> Path | None:
    """This environment's built ops, or ``None`` when they were not built (or their build did not finish)."""
    try:
        folder = cache_dir()
    except importlib.metadata.PackageNotFoundError:
        return None
    return folder if (folder / READY).exists() else None


def build() -> Path:
    """Build the ops into :func:`cache_dir` (a no-op when they are built) and remove the builds of other
    environments past :data:`KEEP_OTHERS` or unused for :data:`KEEP_UNUSED_S`."""
    folder = cache_dir()
    if not (folder / READY).exists():
        folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **build_env(), "TORCH_EXTENSIONS_DIR": str(folder)}
        script = (
            "from deepspeed.accelerator import get_accelerator\n"
            f"for name in {OPS!r}:\n"
            "    get_accelerator().create_op_builder(name).load(verbose=False)\n"
        )
        subprocess.run([sys.executable, "-c", script], env=env, check=True)
        (folder / READY).write_text(json.dumps({"built": time.time()}))
    os.utime(folder / READY)  # used now: what the clean-up goes by
    clean_up(folder)
    return folder


def clean_up(folder: Path) -> None:
    """Remove the builds beside ``folder`` past the :data:`KEEP_OTHERS` last used, or unused for
    :data:`KEEP_UNUSED_S`."""
    others = sorted((_last_used(other), str(other)) for other in folder.parent.iterdir() if other != folder)
    for rank, (used, other) in enumerate(reversed(others)):
        if rank >= KEEP_OTHERS or time.time() - used > KEEP_UNUSED_S:
            shutil.rmtree(other, ignore_errors=True)


def _last_used(folder: Path) -> float:
    """When a test run last used the build in ``folder``; for a build not finished (under way in another run, or
    cut short), when the folder changed last."""
    for path in (folder / READY, folder):
        try:
            return path.stat().st_mtime
        except OSError:
            continue
    return 0.0


def main() -> int:
    start = time.monotonic()
    try:
        importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        print("deepspeed_ops: DeepSpeed is not installed; nothing to build")
        return 0
    try:
        folder = build()
    except subprocess.CalledProcessError as error:  # the tests compile them on first use, and say what failed
        print(f"deepspeed_ops: building DeepSpeed's CPU ops failed ({error}); the tests will compile them")
        return 0
    print(f"DeepSpeed's CPU ops ready in {time.monotonic() - start:.0f} s ({folder})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
