"""Fixtures for the command line tests: ``cli(*argv)`` runs ``trainjob`` in-process; no job or process outlives
a test, and no backend setting of the caller's environment leaks in."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from jobtest.local import delete_all_jobs, processes_under

from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.backends.local.supervisor import warm
from trainjob.cli.main import main

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture(autouse=True)
def no_leftovers(trainjob_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("TRAINJOB_BACKEND", "TRAINJOB_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    yield
    delete_all_jobs(LocalBackend(LocalProcessBackendConfig(home=trainjob_home)))
    assert processes_under(trainjob_home) == []
    assert warm_supervisors() == [], "a warm supervisor `trainjob run` started outlived the command"


def warm_supervisors() -> list[psutil.Process]:
    """This process's children that are warm supervisors (``trainjob run`` starts one; it either gets the
    job or exits when the command ends)."""
    found = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and warm.WARM_SUPERVISOR_FLAG in child.cmdline():
                found.append(child)
    return found


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """``cli("list", "-o", "name")`` -> ``(exit code, stdout, stderr)``."""

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run
