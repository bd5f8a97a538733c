"""Fuzzing the loader, ``trainjob render`` and ``trainjob apply`` with mutated real documents and hostile YAML.

Every example must end within :data:`PER_EXAMPLE_SECONDS` with a result or the project's ``ValidationError``
(from the CLI: exit code 2 and short ``error:`` lines) and never with another exception, a traceback or a hang;
a refused ``apply`` must leave nothing behind (no job row, no job directory). Runs are derandomized, so CI sees
the same examples every time; inputs that once failed are kept as ``@example`` cases.

About 2,100 examples run in all (see :data:`EXAMPLES`), in well under a minute.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trainjob.api import load_resources
from trainjob.backends.local.client.backend import LocalBackend
from trainjob.backends.local.volumes import namespace_problem
from trainjob.cli.main import EXIT_BAD_INPUT, EXIT_OK, cli, main
from trainjob.errors import BackendError, ValidationError

sys.path.insert(0, str(Path(__file__).parent))
from fuzz_inputs import REGRESSIONS, alias_bomb, dump, hostile_texts, merge_bomb, mutated_bundles  # noqa: E402

#: No example may take longer: loading, resolving, rendering and creating a job are all bounded.
PER_EXAMPLE_SECONDS = 5
#: Examples per target and kind of input.
EXAMPLES = {"load": 600, "load-hostile": 300, "render": 500, "render-hostile": 200, "apply": 400, "apply-hostile": 100}
#: A problem's message may quote values (cut at 80 characters) and paths, but never whole inputs.
MAX_PROBLEM_CHARS = 600
#: At most 20 problems and a line counting the rest, plus a line naming the file.
MAX_PROBLEMS = 22

JOB = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: {name}}}
spec:
  runtimeRef: {{name: torch-distributed}}
  trainer: {trainer}
"""


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,  # within() bounds each example, in CPU time (Hypothesis's deadline is wall-clock time)
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.function_scoped_fixture,
        ],
    )


class Hung(BaseException):
    """Raised in the example's own thread when it runs past its time (a BaseException: no handler eats it)."""


#: An example that blocks (no CPU used) is stopped after this many times its CPU limit in wall-clock time.
WALL_STRETCH = 8


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail the example when its body uses more than ``seconds`` of CPU (a loop that never ends), or blocks for
    :data:`WALL_STRETCH` times as long (a wait that never ends). CPU time, not wall-clock time: beside other test
    sessions on a busy machine a bounded example takes longer without doing more. A wall-clock timer that was
    already running (pytest-timeout's) is set again afterwards, less the time spent here."""

    def interrupt(signum: int, frame: object) -> None:
        raise Hung()

    previous_alarm = signal.signal(signal.SIGALRM, interrupt)
    previous_prof = signal.signal(signal.SIGPROF, interrupt)
    outer_left, _ = signal.setitimer(signal.ITIMER_REAL, seconds * WALL_STRETCH)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    start = time.monotonic()
    try:
        yield
    except Hung:
        raise AssertionError(f"example ran past {seconds} s") from None
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, previous_prof)
        signal.signal(signal.SIGALRM, previous_alarm)
        if outer_left:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - start), 0.001))


def assert_short(message: str) -> None:
    """At most :data:`MAX_PROBLEMS` problems of bounded length (``apply`` joins them into one line)."""
    lines = message.splitlines()
    assert 1 <= len(lines) <= MAX_PROBLEMS, f"{len(lines)} error lines"
    assert len(message) <= MAX_PROBLEMS * MAX_PROBLEM_CHARS, f"{len(message)} characters: {message[:300]}"


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``trainjob ARGV`` in this process: its exit code, stdout and stderr. Exceptions propagate (= failure)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def check_refusal(code: int, out: str, err: str) -> None:
    """A successful run prints text that any terminal can take; a refusal is exit 2 and short error lines."""
    assert code in (EXIT_OK, EXIT_BAD_INPUT), (code, err[-500:])
    if code == EXIT_OK:
        out.encode("utf-8")  # no lone surrogates: a real stdout would raise on them
        return
    assert out == ""
    assert_short(err)
    assert all(line.startswith("error: ") for line in err.splitlines())


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="trainjob-fuzz-") as folder:
        yield Path(folder)


#: Asked here, not by the first example that mounts a volume, so that this module passes when run alone too.
MOUNT_NAMESPACES = namespace_problem() is None


@pytest.fixture(scope="module")
def no_processes() -> Iterator[None]:
    """Jobs that ``apply`` accepts are created but their supervisor is not started: the fuzz checks what apply
    creates, not what a job then runs (thousands of torchrun processes would not fit a test). Whether nodes can
    have mount namespaces here is found out once per process, in a short process of its own, the first time a job
    mounts a volume: :data:`MOUNT_NAMESPACES` asks it as this module is collected, outside any test."""
    with mock.patch.object(LocalBackend, "_start_supervisor", lambda self, *args, **kwargs: None):
        yield


def with_regressions(test: Callable[..., None]) -> Callable[..., None]:
    """Run every input of :data:`~fuzz_inputs.REGRESSIONS` as an explicit example of ``test`` first."""
    for text, _ in REGRESSIONS.values():
        test = example(text=text)(test)
    return test


def input_file(workdir: Path, text: str) -> Path:
    path = workdir / "input.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


# -- the loader ---------------------------------------------------------------------------------------------


def check_load(text: str) -> None:
    with within(PER_EXAMPLE_SECONDS):
        try:
            load_resources(text)
        except ValidationError as exc:
            assert_short(str(exc))


@fuzz_settings(EXAMPLES["load"])
@given(st.builds(dump, mutated_bundles()))
def test_loader_takes_mutated_documents(text):
    check_load(text)


@fuzz_settings(EXAMPLES["load-hostile"])
@given(text=hostile_texts)
@with_regressions
@example(text=alias_bomb(9, 9))
@example(text=merge_bomb(30))
@example(text="x" * (5 * 2**20))
@example(text="[" * 300 + "]" * 300)  # one long line was taken for a file name: OSError
def test_loader_takes_hostile_text(text):
    check_load(text)


# -- trainjob render ----------------------------------------------------------------------------------------


def check_render(workdir: Path, text: str) -> None:
    path = input_file(workdir, text)
    with within(PER_EXAMPLE_SECONDS):
        check_refusal(*run_cli("render", "-f", str(path)))


@fuzz_settings(EXAMPLES["render"])
@given(text=st.builds(dump, mutated_bundles()))
def test_render_takes_mutated_documents(workdir, text):
    check_render(workdir, text)


@fuzz_settings(EXAMPLES["render-hostile"])
@given(text=hostile_texts)
@with_regressions
def test_render_takes_hostile_text(workdir, text):
    check_render(workdir, text)


# -- trainjob apply -----------------------------------------------------------------------------------------


def created(home: Path) -> tuple[list[str], list[str]]:
    """The job rows and the job directories under ``home``."""
    database = home / "trainjob.db"
    rows: list[str] = []
    if database.exists():
        with contextlib.closing(sqlite3.connect(database)) as db:
            rows = sorted(name for (name,) in db.execute("SELECT name FROM jobs"))
            rows += [f"event of {job}" for (job,) in db.execute("SELECT job FROM events") if job not in rows]
    folders = sorted(p.name for p in (home / "jobs").iterdir()) if (home / "jobs").is_dir() else []
    return rows, folders


def check_apply(workdir: Path, text: str) -> None:
    path = input_file(workdir, text)
    with tempfile.TemporaryDirectory(dir=workdir) as home, mock.patch.dict(os.environ, {"TRAINJOB_HOME": home}):
        with within(PER_EXAMPLE_SECONDS):
            code, out, err = run_cli("apply", "-f", str(path))
        check_refusal(code, out, err)
        rows, folders = created(Path(home))
        if code == EXIT_BAD_INPUT:
            assert (rows, folders) == ([], []), f"refused ({err.strip()[:300]}) but left {rows} {folders}"
        else:
            assert rows == folders and rows, (rows, folders)


@fuzz_settings(EXAMPLES["apply"])
@given(text=st.builds(dump, mutated_bundles()))
def test_apply_takes_mutated_documents(workdir, no_processes, text):
    check_apply(workdir, text)


@fuzz_settings(EXAMPLES["apply-hostile"])
@given(text=hostile_texts)
@with_regressions
def test_apply_takes_hostile_text(workdir, no_processes, text):
    check_apply(workdir, text)


# -- each input that once crashed a command, one by one -----------------------------------------------------


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_each_regression_input_exits_2_with_a_clear_line(workdir, name):
    text, expected = REGRESSIONS[name]
    with within(PER_EXAMPLE_SECONDS):
        code, out, err = run_cli("render", "-f", str(input_file(workdir, text)))
    if not expected:
        assert (code, err) == (EXIT_OK, "") and out
        return
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert expected in err
    assert_short(err)


def test_apply_creates_every_job_of_a_file_or_none(workdir, no_processes):
    runs = JOB.format(name="first", trainer="{command: [python, t.py]}")
    has_no_command = JOB.format(name="second", trainer="{numNodes: 1}")  # the local backend refuses it
    check_apply(workdir, f"{runs}---\n{has_no_command}")


def test_apply_stores_a_job_in_space_that_grows_with_its_input_not_input_times_nodes(workdir, no_processes):
    large_env = f"[{{name: A, value: {'x' * 10_000}}}]"
    script = workdir / "t.py"  # apply refuses a command whose script does not exist
    script.write_text("")
    text = JOB.format(name="wide", trainer=f"{{numNodes: 1000, command: [python, {script}], env: {large_env}}}")
    with tempfile.TemporaryDirectory(dir=workdir) as home, mock.patch.dict(os.environ, {"TRAINJOB_HOME": home}):
        assert run_cli("apply", "-f", str(input_file(workdir, text)))[0] == EXIT_OK
        with contextlib.closing(sqlite3.connect(Path(home) / "trainjob.db")) as db:
            (stored,) = db.execute("SELECT length(launch) FROM jobs").fetchone()
    assert stored < 2**20 + 10 * len(text)  # a small part per node (rank, log paths) plus the input, not 10 MB


def test_a_trainjob_error_a_command_does_not_handle_exits_1_without_a_traceback(workdir):
    job = input_file(workdir, JOB.format(name="mnist", trainer="{numNodes: 2}"))
    with mock.patch("trainjob.runtime.find_runtime", side_effect=BackendError("the catalog is unreachable")):
        code, out, err = run_cli("render", "-f", str(job))
    assert (code, out, err) == (1, "", "error: the catalog is unreachable\n")


def test_the_example_timer_stops_a_hang():
    start = time.monotonic()
    with pytest.raises(AssertionError, match="example ran past 0.2 s"), within(0.2):
        while True:
            pass
    # Real clock on purpose: guards that the example timer stops a hang at 0.2 s of CPU (by 1.6 s of wall-clock
    # time on the busiest machine), not at the test's timeout.
    assert time.monotonic() - start < 0.2 * WALL_STRETCH + 1


def test_the_example_timer_stops_a_blocked_example_by_wall_clock_time():
    start = time.monotonic()
    with pytest.raises(AssertionError, match="example ran past 0.1 s"), within(0.1):
        time.sleep(30)
    assert 0.1 * WALL_STRETCH - 0.05 < time.monotonic() - start < 0.1 * WALL_STRETCH + 1


def test_render_reads_stdin_only_up_to_the_size_limit():
    result = CliRunner().invoke(cli, ["render", "-f", "-"], input="#" * (5 * 2**20))
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr == (
        "error: <stdin>: input is larger than 4 MiB; the limit is 4 MiB (split it into several files)\n"
    )
