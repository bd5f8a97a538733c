"""Fixtures for the dashboard's tests: a dashboard served on loopback, and Debian's Chromium driven by Playwright.

Chromium is Debian's ``chromium`` package (``scripts/setup.sh`` installs it when it can), started headless by the
test (:mod:`browsertest`); nothing downloads a browser. Without it (or without the ``playwright`` package) the
browser tests are skipped with the reason, or fail when ``TRAINJOB_REQUIRE_BROWSER=1`` (CI sets it). Screenshots go to
``$TRAINJOB_ARTIFACTS/ui`` (default ``tests-artifacts/ui`` in the repository); the run's summary prints where.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browsertest import launch, require_browser
from jobtest.tiers import starts

from trainjob.backends.local.client.backend import LocalBackend

REPO = Path(__file__).resolve().parents[2]
_saved: list[Path] = []


def artifacts_dir() -> Path:
    return Path(os.environ.get("TRAINJOB_ARTIFACTS") or REPO / "tests-artifacts") / "ui"


@pytest.fixture
def backend(local_jobs: LocalBackend) -> LocalBackend:
    """The local backend of tests/conftest.py's ``local_jobs``: no job or process outlives the test."""
    return local_jobs


@pytest.fixture
def dashboard(backend: LocalBackend) -> Iterator[str]:
    """The dashboard's base URL, served by uvicorn on a free loopback port in this process."""
    import uvicorn

    from trainjob.ui.server import create_app

    server = uvicorn.Server(uvicorn.Config(create_app(backend), host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="off", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="session")
@starts("browser")
def browser() -> Iterator[Any]:
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_default_timeout(60_000)
    yield page
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


@pytest.fixture(scope="session")
def screenshots_dir() -> Path:
    directory = artifacts_dir()
    shutil.rmtree(directory, ignore_errors=True)  # this run's screenshots only
    directory.mkdir(parents=True)
    return directory


@pytest.fixture
def screenshot(screenshots_dir: Path) -> Any:
    """``screenshot(page, "suspended")`` saves ``<artifacts>/ui/suspended.png`` and returns its path."""

    def save(page: Any, what: str, full_page: bool = True) -> Path:
        path = screenshots_dir / f"{what}.png"
        assert path not in _saved, f"two screenshots named {what}"
        page.screenshot(path=str(path), full_page=full_page)
        _saved.append(path)
        return path

    return save


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _saved:
        terminalreporter.write_line(f"browser screenshots ({len(_saved)}) in {artifacts_dir()}:")
        for path in _saved:
            terminalreporter.write_line(f"  {path.name}")
