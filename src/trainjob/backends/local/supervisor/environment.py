"""``packages_to_install``, installed once per distinct set into a cached environment that still sees this one.

The environment of a set of packages is ``$TRAINJOB_HOME/envs/<key>`` (:func:`environment_dir`; ``<key>`` hashes
the sorted requirements, the index URLs and this Python). It is a virtual environment whose ``site-packages`` adds
this interpreter's site-packages (and their ``.pth`` files, so editable installs keep working) after its own:
packages pip installs there win, everything else (torch) resolves as before, and pip sees installed packages as
satisfied. The first job that needs it creates it and pip-installs the packages, holding ``<key>.lock``, so a job
asking for the same set meanwhile waits and then reuses it; a later job starts without installing. An environment
is complete once its :data:`MARKER` is written; one without it (an install that failed or was stopped) is removed
and built again. Environments are kept until removed (``rm -r $TRAINJOB_HOME/envs``): upgrading this environment
or changing pip's configuration does not rebuild them.

pip's output goes to ``on_line`` as it comes (the supervisor writes it into node-0's log and the job's message)::

    venv = environment_dir(home, ["tqdm>=4"], ["https://pypi.org/simple"])
    prepared = prepare_environment(venv, ["tqdm>=4"], on_line=print)   # installs, or reuses at once
    prepared.python, prepared.installed
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import queue
import shutil
import site
import subprocess
import sys
import sysconfig
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trainjob.sdk.types import DEFAULT_PIP_INDEX_URLS

PIP_TIMEOUT_SECONDS = 900
#: Where the cached environments live under ``$TRAINJOB_HOME``.
ENVS_DIR = "envs"
#: Written into an environment once its packages are installed: what, from where, when.
MARKER = "trainjob-env.json"
_LOCK_POLL_SECONDS = 0.2


class PackageInstallError(RuntimeError):
    """pip could not install the requested packages; the message is pip's own."""


class InstallStopped(PackageInstallError):
    """The install was stopped because the job is going away (``should_stop``)."""


@dataclass(frozen=True)
class Prepared:
    """An environment ready to run a job: its ``python``, and whether this call ``installed`` the packages (else it
    reused them) in how many ``seconds``."""

    python: str
    installed: bool
    seconds: float = 0.0


def environment_dir(home: Path, packages: list[str], pip_index_urls: list[str] | None = None) -> Path:
    """The cached environment of ``packages`` from ``pip_index_urls`` for this Python, under ``home``."""
    identity = {
        "packages": sorted(set(packages)),
        "index": index_options(pip_index_urls),
        "python": [sys.prefix, *sys.version_info[:3]],
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    return Path(home) / ENVS_DIR / key


def prepare_environment(
    venv: Path,
    packages: list[str],
    pip_index_urls: list[str] | None = None,
    on_line: Callable[[str], None] = lambda line: None,
    should_stop: Callable[[], bool] = lambda: False,
) -> Prepared:
    """``venv`` with ``packages`` installed: reused when complete, else (re)built under its lock. pip's lines go
    to ``on_line``; ``should_stop()`` true stops waiting or installing (:class:`InstallStopped`)."""
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with _locked(venv.with_name(venv.name + ".lock"), on_line, should_stop):
        if (venv / MARKER).is_file():
            return Prepared(str(python), installed=False)
        started = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)  # what an install that failed or was stopped left
        try:
            _create(venv, python)
            _pip_install(python, packages, pip_index_urls, on_line, should_stop)
            record = {"packages": packages, "pip_index_urls": list(pip_index_urls or []), "installed": time.time()}
            (venv / MARKER).write_text(json.dumps(record), encoding="utf-8")
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        return Prepared(str(python), installed=True, seconds=time.monotonic() - started)


@contextlib.contextmanager
def _locked(path: Path, on_line: Callable[[str], None], should_stop: Callable[[], bool]) -> Iterator[None]:
    """Hold ``path``'s lock (the kernel drops it when its holder dies), saying so when another holds it first."""
    with path.open("a") as lock:
        waiting = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting:
                    on_line("[trainjob] another job is installing the same packages; waiting for it")
                    waiting = True
                if should_stop():
                    raise InstallStopped("stopped while waiting for another job's install") from None
                time.sleep(_LOCK_POLL_SECONDS)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _create(venv: Path, python: Path) -> None:
    """A virtual environment at ``venv`` that sees this interpreter's packages after its own."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )
    parents = [p for p in dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]]) if Path(p).is_dir()]
    lines = [f"import site; site.addsitedir({p!r})" for p in parents]
    (purelib / "zz-trainjob-parent.pth").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _pip_install(python: Path, packages: list[str], pip_index_urls: list[str] | None,
                 on_line: Callable[[str], None], should_stop: Callable[[], bool]) -> None:
    """Run pip, each line of its output to ``on_line`` as it comes; :class:`PackageInstallError` with pip's own
    error lines when it fails or takes longer than :data:`PIP_TIMEOUT_SECONDS`."""
    command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--progress-bar",
               "off", *index_options(pip_index_urls), *packages]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace", env=env)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(process, lines), daemon=True).start()
    kept: deque[str] = deque(maxlen=200)
    deadline = time.monotonic() + PIP_TIMEOUT_SECONDS
    try:
        while True:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                line = ""
            if line is None:
                break
            if line:
                kept.append(line)
                on_line(line)
            if should_stop():
                raise InstallStopped(f"pip install {' '.join(packages)} stopped: the job is going away")
            if time.monotonic() > deadline:
                raise PackageInstallError(f"pip install {' '.join(packages)} took longer than {PIP_TIMEOUT_SECONDS} s")
        code = process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if code != 0:
        raise PackageInstallError(f"pip install {' '.join(packages)} failed: {pip_error(chr(10).join(kept))}")


def _read_lines(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def index_options(pip_index_urls: list[str] | None) -> list[str]:
    """pip options for the index URLs; none for the default index, so a local pip configuration still applies."""
    urls = list(pip_index_urls or [])
    if not urls or urls == list(DEFAULT_PIP_INDEX_URLS):
        return []
    return ["--index-url", urls[0], *(option for url in urls[1:] for option in ("--extra-index-url", url))]


def pip_error(output: str) -> str:
    """pip's ``ERROR:`` lines, or its last line when there are none."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return " ".join(errors) if errors else (lines[-1] if lines else "no output")
