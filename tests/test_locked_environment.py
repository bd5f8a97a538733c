"""The dev and CI environment is the one ``requirements/dev.lock`` pins, and the lock satisfies ``pyproject.toml``.

``scripts/setup.sh`` installs the lock; ``scripts/lock.sh`` refreshes it. A dependency added to ``pyproject.toml``
without refreshing the lock, or an environment that drifted from it (a hand-run ``pip install -U``), fails here
rather than as a mystery elsewhere. Set ``TRAINJOB_UNLOCKED_ENV=1`` to run the suite in an environment of your own.
"""

from __future__ import annotations

import os
import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "dev.lock"


def locked() -> dict[str, str]:
    """Canonical package name -> pinned version."""
    pins = {}
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.strip())
        if match:
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def dev_requirements() -> list[Requirement]:
    """Every requirement the ``dev`` extra pulls in from pyproject.toml, its own extras expanded."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    wanted, seen, out = ["dev"], set(), [Requirement(r) for r in project["dependencies"]]
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in extras[extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == "trainjob":
                wanted.extend(requirement.extras)
            else:
                out.append(requirement)
    return out


def test_every_dev_requirement_is_pinned_within_its_range():
    pins = locked()
    problems = []
    for requirement in dev_requirements():
        pinned = pins.get(canonicalize_name(requirement.name))
        if pinned is None:
            problems.append(f"{requirement.name} is not in the lock")
        elif not requirement.specifier.contains(pinned, prereleases=True):
            problems.append(f"{requirement.name}=={pinned} is outside {requirement.specifier}")
    assert problems == [], "requirements/dev.lock is stale; run bash scripts/lock.sh: " + "; ".join(problems)


def test_torch_is_the_constrained_version():
    lines = (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines()
    (constraint,) = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    assert constraint.name == "torch" and constraint.specifier.contains(locked()["torch"])


@pytest.mark.skipif(os.environ.get("TRAINJOB_UNLOCKED_ENV") == "1", reason="TRAINJOB_UNLOCKED_ENV=1: an environment of the user's own")
def test_the_installed_environment_is_the_lock():
    drifted = []
    for name, version in sorted(locked().items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            drifted.append(f"{name}=={version} is not installed")
            continue
        if installed != version:
            drifted.append(f"{name} is {installed}, the lock says {version}")
    assert drifted == [], "run bash scripts/setup.sh (it installs requirements/dev.lock): " + "; ".join(drifted)
