"""Test tiers, by what a test starts. A fixture that starts something says so with :func:`starts`; every test
that uses it (directly or through other fixtures) gets the marker, so no test is marked by hand::

    @pytest.fixture(scope="session")
    @starts("cluster", "nodes")
    def k8s(...): ...

========  ===========================================================================================
marker    the test starts
========  ===========================================================================================
cluster   the Kubernetes test control plane (etcd, kube-apiserver, controllers, JobSet, the operator)
nodes     pods on the cluster's real nodes: kubelets with containerd and runc (root)
browser   headless Chromium
procs     processes: torch ranks, local jobs (supervisor, node keepers, torchrun), CLI subprocesses
========  ===========================================================================================

``scripts/test.sh --fast`` runs the tests with none of these. A test in that tier that starts a process anyway
fails at once (:func:`forbid_processes`), naming what it started, so the tiers stay true as tests change.
"""

from __future__ import annotations

import multiprocessing.process
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

TIERS = {
    "cluster": "starts the Kubernetes test control plane",
    "nodes": "runs pods on the test cluster's real nodes (kubelet, containerd, runc; needs root)",
    "browser": "starts headless Chromium",
    "procs": "starts processes (torch ranks, local jobs, CLI subprocesses)",
}
#: The tiers that ``--fast`` leaves out: all of them.
FAST_EXCLUDES = " or ".join(TIERS)

F = TypeVar("F", bound=Callable[..., Any])


def starts(*tiers: str) -> Callable[[F], F]:
    """Mark a fixture function as starting what ``tiers`` name (keys of :data:`TIERS`)."""
    unknown = set(tiers) - set(TIERS)
    if unknown:
        raise ValueError(f"unknown tier(s) {sorted(unknown)}; known: {sorted(TIERS)}")

    def tag(function: F) -> F:
        function.trainjob_tiers = frozenset(getattr(function, "trainjob_tiers", ())) | frozenset(tiers)  # type: ignore[attr-defined]
        return function

    return tag


def tiers_of(item: pytest.Item) -> set[str]:
    """The tiers of every fixture ``item`` uses, its fixtures' fixtures included."""
    info = getattr(item, "_fixtureinfo", None)
    found: set[str] = set()
    if info is None:
        return found
    for name in info.names_closure:
        for definition in info.name2fixturedefs.get(name, ()):
            found |= getattr(definition.func, "trainjob_tiers", frozenset())
    return found


class ProcessStarted(AssertionError):
    """A test of the fast tier started a process."""


@contextmanager
def forbid_processes(test: str) -> Iterator[list[str]]:
    """Within the block, starting a process (``subprocess``, ``multiprocessing``) raises :class:`ProcessStarted`;
    the list yielded collects the refusals too, in case the code under test swallows the exception."""
    refused: list[str] = []

    def refuse(what: str) -> None:
        refused.append(what[:200])
        raise ProcessStarted(
            f"{test} starts a process ({what[:200]}) but none of its fixtures says so; take it from a fixture "
            "marked with jobtest.tiers.starts('procs') (or add that to the fixture that starts it)"
        )

    original_popen = subprocess.Popen.__init__
    original_start = multiprocessing.process.BaseProcess.start

    def popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        refuse(f"subprocess: {args if isinstance(args, str) else ' '.join(map(str, args))}")

    def start(self: multiprocessing.process.BaseProcess) -> None:
        refuse(f"multiprocessing: {self.name}")

    subprocess.Popen.__init__ = popen  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]
    try:
        yield refused
    finally:
        subprocess.Popen.__init__ = original_popen  # type: ignore[method-assign]
        multiprocessing.process.BaseProcess.start = original_start  # type: ignore[method-assign]
