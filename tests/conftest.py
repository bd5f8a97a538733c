"""Shared fixtures: every test gets its own TRAINJOB_HOME under its temp dir."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(autouse=True)
def trainjob_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "trainjob-home"
    monkeypatch.setenv("TRAINJOB_HOME", str(home))
    return home
