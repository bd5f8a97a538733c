"""Without a browser the browser tests skip and say why, unless TRAINJOB_REQUIRE_BROWSER=1 (CI) makes them fail."""

from __future__ import annotations

import sys

import pytest
from browsertest import require_browser


@pytest.mark.parametrize("missing", ["chromium", "playwright"])
def test_a_missing_browser_skips_with_the_reason_or_fails_when_required(tmp_path, monkeypatch, missing):
    if missing == "chromium":
        monkeypatch.setenv("TRAINJOB_CHROMIUM", str(tmp_path / "no-chromium-here"))
        reason = f"no Chromium at {tmp_path / 'no-chromium-here'} (apt-get install chromium, or set TRAINJOB_CHROMIUM)"
    else:
        monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # the import fails
        reason = "the playwright package is not installed (pip install -e '.[dev]')"

    monkeypatch.delenv("TRAINJOB_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_browser()
    assert skipped.value.msg == reason
    monkeypatch.setenv("TRAINJOB_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception) as failed:
        require_browser()
    assert failed.value.msg == f"TRAINJOB_REQUIRE_BROWSER=1 but {reason}"
