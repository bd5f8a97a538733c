"""DeepSpeed with its CPU ops compiled in, for the DeepSpeed tests: built once per machine, installed in seconds.

DeepSpeed's only release is a source one. ``scripts/setup.sh`` installs it without its ops (``DS_BUILD_OPS=0``):
the demo and ``plan --ds-config`` need none, and DeepSpeed compiles the ones a job loads (CPU Adam, fused Adam,
shared-memory comm) on first use, into ``TORCH_EXTENSIONS_DIR``. That build is ninja's, which rebuilds whatever
is older than its sources: a fresh clone's ``.venv`` installs torch and DeepSpeed anew, so every clean checkout
paid it again (7.5 minutes beside the test cluster's chain on 2 cores, in every CI run).

``bash scripts/test.sh`` (not ``--fast``) runs this module (``python -m jobtest.deepspeed_ops``) instead: it builds
a wheel of the pinned DeepSpeed with the ops compiled in (``DS_BUILD_CPU_ADAM=1`` and the others: DeepSpeed's own
way to ship prebuilt ops), keeps it under ``~/.cache/trainjob/deepspeed-wheels/KEY``, and installs it over the plain
one. KEY names what the ops are compiled against, by content rather than by date: DeepSpeed's version, torch's
version and the hashes of its installed files (its ``RECORD``), the interpreter's version and the compiler. A fresh
``.venv`` with the same torch finds the wheel and installs it in seconds; the jobs then compile nothing. Other keys'
wheels are kept for a while (two checkouts side by side each keep theirs): the two last used, each until unused for
two weeks.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The ops the DeepSpeed configs of examples/deepspeed load on the CPU accelerator, by the module each is compiled
#: into (``deepspeed/ops/...``) and the variable that has DeepSpeed's build compile it.
OPS = {
    "adam/cpu_adam_op": "DS_BUILD_CPU_ADAM",
    "adam/fused_adam_op": "DS_BUILD_FUSED_ADAM",
    "comm/deepspeed_shm_comm_op": "DS_BUILD_SHM_COMM",
}
READY = "ready"
#: Another environment's wheel (another torch, an older DeepSpeed) is removed once unused this long.
KEEP_UNUSED_S = 14 * 24 * 3600
#: ... and at most this many others are kept (a few MB each), the most recently used.
KEEP_OTHERS = 2


def _first_line(command: list[str]) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "missing"
    return out.splitlines()[0] if out else ""


def record_hash(record: str) -> str:
    """The hash of a distribution's ``RECORD``: every installed file's own hash, so the same build installed
    anew gives the same value and another build (a local version, a patched file) does not. The files outside
    ``site-packages`` (``../../../bin/torchrun``: its first line names the ``.venv``'s interpreter) are left out."""
    files = sorted(line for line in record.splitlines()
                   if not line.startswith("../") and ".dist-info/" not in line and "__pycache__" not in line)
    return hashlib.sha256("\n".join(files).encode()).hexdigest()


def package_dir() -> Path | None:
    """The installed ``deepspeed`` package's folder (found, not imported: importing it imports torch)."""
    spec = importlib.util.find_spec("deepspeed")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def missing_ops() -> list[str]:
    """The :data:`OPS` the installed DeepSpeed was not built with (all of them when it is not installed)."""
    folder = package_dir()
    if folder is None:
        return list(OPS)
    return [op for op in OPS if not list((folder / "ops").glob(f"{op}*.so"))]


def wheel_dir() -> Path:
    """The folder for this environment's wheel: ``~/.cache/trainjob/deepspeed-wheels/KEY``."""
    versions = {
        "python": sys.version,
        "platform": platform.machine(),
        "torch": [importlib.metadata.version("torch"),
                  record_hash(importlib.metadata.distribution("torch").read_text("RECORD") or "")],
        "deepspeed": importlib.metadata.version("deepspeed"),
        "ops": sorted(OPS.values()),
        "c++": _first_line([os.environ.get("CXX", "c++"), "--version"]),
    }
    key = hashlib.sha256(json.dumps(versions, sort_keys=True).encode()).hexdigest()[:16]
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "trainjob" / "deepspeed-wheels" / key


def build_wheel(folder: Path) -> Path:
    """The wheel in ``folder``, built first when it is not there (minutes): the installed DeepSpeed's version from
    PyPI's source release, against the installed torch (no build isolation), the CPU ops of :data:`OPS` compiled
    in. The build goes to a temporary folder beside ``folder``, renamed into place once complete."""
    if (folder / READY).exists():
        return next(folder.glob("deepspeed-*.whl"))
    folder.parent.mkdir(parents=True, exist_ok=True)
    version = importlib.metadata.version("deepspeed")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0", **{var: "1" for var in OPS.values()},
           # this interpreter's bin (its ninja) first, as for the jobs
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-build-isolation", "--no-cache-dir", "-w", str(staging), f"deepspeed=={version}"],
                       env=env, check=True)  # fmt: skip
        (staging / READY).write_text(json.dumps({"built": time.time()}))
        shutil.rmtree(folder, ignore_errors=True)  # an earlier build's folder without its wheel
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone once renamed
    return next(folder.glob("deepspeed-*.whl"))


def install(wheel: Path) -> None:
    """Install ``wheel`` over the installed DeepSpeed (its dependencies are installed already)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-index", "--force-reinstall", str(wheel)], check=True)  # fmt: skip


def prepare() -> Path | None:
    """DeepSpeed with :data:`OPS` compiled in, installed: nothing to do when it is, else this environment's wheel,
    built first when there is none. Returns the wheel's folder (``None`` when there was nothing to do)."""
    if not missing_ops():
        return None
    folder = wheel_dir()
    install(build_wheel(folder))
    if missing_ops():
        raise RuntimeError(f"the wheel in {folder} was installed but DeepSpeed still lacks {missing_ops()}")
    os.utime(folder / READY)  # used now: what the clean-up goes by
    clean_up(folder)
    return folder


def clean_up(folder: Path) -> None:
    """Remove the wheels beside ``folder`` past the :data:`KEEP_OTHERS` last used, or unused for
    :data:`KEEP_UNUSED_S`."""
    others = sorted((_last_used(other), str(other)) for other in folder.parent.iterdir()
                    if other != folder and not other.name.startswith("."))  # fmt: skip
    for rank, (used, other) in enumerate(reversed(others)):
        if rank >= KEEP_OTHERS or time.time() - used > KEEP_UNUSED_S:
            shutil.rmtree(other, ignore_errors=True)


def _last_used(folder: Path) -> float:
    """When a test run last used the wheel in ``folder``; for a build not finished, when the folder changed last."""
    for path in (folder / READY, folder):
        try:
            return path.stat().st_mtime
        except OSError:
            continue
    return 0.0


def main() -> int:
    start = time.monotonic()
    if package_dir() is None:
        print("deepspeed_ops: DeepSpeed is not installed; nothing to build")
        return 0
    try:
        folder = prepare()
    except (subprocess.CalledProcessError, RuntimeError, StopIteration) as error:
        # the jobs then compile the ops on first use, and the tests say what failed
        print(f"deepspeed_ops: installing DeepSpeed with its CPU ops failed ({error}); the jobs will compile them")
        return 0
    where = f"from {folder}" if folder else "installed already"
    print(f"DeepSpeed with its CPU ops ready in {time.monotonic() - start:.0f} s ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
