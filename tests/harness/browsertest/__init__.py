"""Debian's Chromium, headless, driven by Playwright: for the dashboard's browser tests and its benchmark.

Nothing downloads a browser: Playwright is pointed at ``$TRAINJOB_CHROMIUM`` (default ``/usr/bin/chromium``, the
``chromium`` package that ``scripts/setup.sh`` installs when it can)::

    require_browser()                      # skip with the reason, or fail under TRAINJOB_REQUIRE_BROWSER=1
    with sync_playwright() as playwright:
        browser = launch(playwright)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["CHROMIUM_ARGS", "REQUIRE_BROWSER_ENV", "browser_unavailable", "chromium_path", "launch", "require_browser"]

REQUIRE_BROWSER_ENV = "TRAINJOB_REQUIRE_BROWSER"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def chromium_path() -> str:
    return os.environ.get("TRAINJOB_CHROMIUM", "/usr/bin/chromium")


def browser_unavailable() -> str | None:
    """Why the browser tests cannot run here, or ``None`` when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    path = chromium_path()
    if not (Path(path).is_file() and os.access(path, os.X_OK)):
        return f"no Chromium at {path} (apt-get install chromium, or set TRAINJOB_CHROMIUM)"
    return None


def require_browser() -> None:
    """Skip the calling test with the reason when there is no browser; fail it under ``TRAINJOB_REQUIRE_BROWSER=1``."""
    import pytest

    reason = browser_unavailable()
    if reason is None:
        return
    if os.environ.get(REQUIRE_BROWSER_ENV) == "1":
        pytest.fail(f"{REQUIRE_BROWSER_ENV}=1 but {reason}")
    pytest.skip(reason)


def launch(playwright: Any) -> Any:
    """Debian's Chromium, headless, with no network of its own beyond what the page asks for."""
    return playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
