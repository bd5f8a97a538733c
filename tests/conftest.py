"""Shared fixtures and the test tiers.

Every test gets its own TRAINJOB_HOME under its temp dir. Tests are marked by what they start, from the fixtures
they use (:mod:`jobtest.tiers`): ``cluster``, ``nodes``, ``browser``, ``procs``; ``--fast`` keeps only the tests
that start none of them (``scripts/test.sh --fast``), and those are held to it: starting a process fails them.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jobtest import cpu as cpu_report
from jobtest.tiers import FAST_EXCLUDES, TIERS, forbid_processes, starts, tiers_of

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help=f"only the tests that start nothing ({FAST_EXCLUDES}): about 3 minutes on 2 cores")


def pytest_configure(config: pytest.Config) -> None:
    # A session started in the background by a shell (scripts/test.sh runs the cluster tier so) begins with SIGINT
    # ignored; it is made to stop on SIGINT as any other, tearing its fixtures (a cluster, its pods) down.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {what} (applied from the fixtures it uses)")
    if config.getoption("--fast"):
        selected = config.getoption("markexpr")
        fast = f"not ({FAST_EXCLUDES})"
        config.option.markexpr = f"({selected}) and {fast}" if selected else fast
    cpu_report.register(config)


def pytest_sessionstart(session: pytest.Session) -> None:
    # The reference schemas (JobSet's and Kubeflow's CRDs) come out of Go modules through a script: fetched once
    # here, before any test, so the tests of the fast tier that read them start no process of their own.
    from kubetest.reference import reference_dir

    with contextlib.suppress(LookupError):  # no Go: the tests that need them skip, with the reason
        reference_dir()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for tier in sorted(tiers_of(item)):
            item.add_marker(tier)


def _held_to_the_fast_tier(item: pytest.Item) -> Iterator[None]:
    if any(item.get_closest_marker(tier) for tier in TIERS):
        return (yield)
    with forbid_processes(item.nodeid) as refused:
        result = yield
    assert not refused, f"{item.nodeid} started a process without a fixture that says so: {refused[0]}"
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _held_to_the_fast_tier(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _held_to_the_fast_tier(item))


@pytest.fixture(autouse=True)
def trainjob_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "trainjob-home"
    monkeypatch.setenv("TRAINJOB_HOME", str(home))
    return home


@pytest.fixture(scope="session")
@starts("procs")
def distributed() -> Callable[..., Any]:
    """:func:`trainjob.torch.testing.run_distributed`: a function run on N real ranks of a gloo process group."""
    from trainjob.torch.testing import run_distributed

    return run_distributed


@pytest.fixture
@starts("procs")
def local_jobs(trainjob_home: Path) -> Iterator[Any]:
    """The local backend on this test's TRAINJOB_HOME, for tests that start jobs (through it, the CLI or the SDK):
    every job is deleted afterwards and no process of theirs may outlive the test."""
    from jobtest.local import delete_all_jobs, processes_under

    from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig

    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))
    yield backend
    delete_all_jobs(backend)
    assert processes_under(trainjob_home) == []


class Subprocesses:
    """``subprocess.run`` and ``Popen`` for a test; whatever is still running afterwards is killed."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[Any]] = []

    def run(self, *args: Any, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        return subprocess.run(*args, **kwargs)

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        process = subprocess.Popen(*args, **kwargs)
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait(10)


@pytest.fixture
@starts("procs")
def subprocesses() -> Iterator[Subprocesses]:
    """For a test that runs commands itself (a script, ``python -c``, torchrun, the CLI as a command)."""
    processes = Subprocesses()
    yield processes
    processes.stop_all()
