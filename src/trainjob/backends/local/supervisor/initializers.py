"""Running the steps a job's trainer waits for (:mod:`~trainjob.backends.local.initializer_steps`), one process
each, before the nodes start.

Each step's output goes into node-0's log, each line prefixed with the step's name (``[dataset-initializer]
...``), so ``trainjob logs`` shows it before the training's; while it runs the job stays ``Created`` with reason
``Initializing`` and its progress as the message (``dataset-initializer: 45% of 1.0 GB (...)``, from the progress
file trainjob's initializer keeps), which ``trainjob get`` shows. A step that exits non-zero fails the job with
reason ``InitializerFailed`` and its last error line; a suspend or delete stops it. Steps that finished are not run
again when the node group restarts or a replacement supervisor takes over (``<job dir>/steps/<name>.done``).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainjob.backends.local.initializer_steps import StepProcessSpec
from trainjob.backends.local.node_env import with_python
from trainjob.backends.local.process_specs import node_argv
from trainjob.constants import JOB_DIR_ENV
from trainjob.initializers.__main__ import ERROR_PREFIX
from trainjob.initializers.config import PROGRESS_ENV

POLL_SECONDS = 0.25
STOP_GRACE_SECONDS = 5.0


class StepsStopped(Exception):
    """A suspend or delete came while a step ran; it was stopped."""


@dataclass
class StepFailure:
    step: str
    message: str


def steps_dir(job_dir: Path) -> Path:
    return job_dir / "steps"


def run_steps(
    steps: list[StepProcessSpec],
    job_dir: Path,
    python: str,
    base_env: Mapping[str, str],
    cwd: str,
    write_log: Callable[[str], None],
    on_progress: Callable[[str, str], None],
    should_stop: Callable[[], bool],
) -> StepFailure | None:
    """Run ``steps`` in order (those done already are skipped); the first failure, or ``None``. ``write_log``
    takes each output line (prefixed), ``on_progress(step, line)`` the progress to show; :class:`StepsStopped`
    when ``should_stop()`` turns true."""
    folder = steps_dir(job_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for step in steps:
        done = folder / f"{step.name}.done"
        if done.exists():
            continue
        progress_file = folder / f"{step.name}.progress.json"
        env = with_python({**base_env, **step.env, JOB_DIR_ENV: str(job_dir), PROGRESS_ENV: str(progress_file)},
                          python)
        argv = node_argv(step.command, python)
        on_progress(step.name, f"starting: {' '.join(step.command)}")
        started = time.monotonic()
        code, tail = _run(argv, env, cwd, step.name, write_log, progress_file, on_progress, should_stop)
        if code != 0:
            return StepFailure(step.name, _failure_line(tail) or f"exited with code {code}")
        done.write_text(json.dumps({"seconds": round(time.monotonic() - started, 3), "last": list(tail)[-1:]}))
    return None


def _run(argv: list[str], env: dict[str, str], cwd: str, name: str, write_log: Callable[[str], None],
         progress_file: Path, on_progress: Callable[[str, str], None],
         should_stop: Callable[[], bool]) -> tuple[int, deque[str]]:
    try:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, errors="replace", env=env, cwd=cwd, start_new_session=True)
    except OSError as exc:
        return 127, deque([f"cannot start {argv[0]}: {exc}"])
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(process, lines), daemon=True).start()
    tail: deque[str] = deque(maxlen=50)
    shown = 0.0
    try:
        while True:
            try:
                line = lines.get(timeout=POLL_SECONDS)
            except queue.Empty:
                line = ""
            if line:
                tail.append(line)
                write_log(f"[{name}] {line}")
            mtime = _mtime(progress_file)
            if mtime > shown:
                shown = mtime
                said = _progress_line(progress_file)
                if said:
                    on_progress(name, said)
            if line is None:
                break
            if should_stop():
                raise StepsStopped(f"{name} stopped: the job is going away")
        return process.wait(), tail
    finally:
        if process.poll() is None:
            _stop(process)


def _stop(process: subprocess.Popen[str]) -> None:
    import signal

    for sig, wait in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def _read_lines(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _progress_line(path: Path) -> str:
    from trainjob.initializers.transfer import ProgressState

    try:
        data = json.loads(path.read_text())
        return ProgressState(**{k: v for k, v in data.items() if k in ProgressState.__dataclass_fields__}).line()
    except (OSError, ValueError, TypeError):
        return ""


def _failure_line(tail: deque[str]) -> str:
    """The step's own reason: what trainjob's initializer prints after ``error: ``; for another command its last
    line that looks like an error, else its last line."""
    lines = [line.strip() for line in tail if line.strip()]
    for line in reversed(lines):
        if line.startswith(ERROR_PREFIX):
            return line[len(ERROR_PREFIX):][:1000]
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line[:1000]
    return lines[-1][:1000] if lines else ""
