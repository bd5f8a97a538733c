"""Fixtures: a Kubernetes API stand-in on loopback (kmock) that validates what it receives, and the real operator.

Tests talk to the stand-in with the real ``kubernetes`` client; the operator is the real kopf operator started from
``trainjob.backends.kubernetes.operator`` in a thread. Nothing is monkey-patched.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trainjob.backends.kubernetes.testing.harness import Cluster, write_kubeconfig
from trainjob.backends.kubernetes.testing.server import StandInServer
from trainjob.backends.kubernetes.testing.validators import reference_validators

REFERENCE = Path(__file__).resolve().parents[3].parent / "shared" / "reference"


@pytest.fixture
def standin() -> Iterator[StandInServer]:
    with StandInServer(validators=reference_validators(REFERENCE)) as server:
        yield server


@pytest.fixture
def cluster(standin: StandInServer, tmp_path: Path) -> Iterator[Cluster]:
    """A stand-in with the built-in runtimes installed and the operator running."""
    c = Cluster(standin, write_kubeconfig(tmp_path / "kubeconfig", standin.url))
    c.install_builtin_runtimes()
    c.operator.start()
    try:
        yield c
    finally:
        c.operator.stop()
        assert not standin.call(lambda api: [e for e in api.errors if _is_server_fault(e)]), (
            "the stand-in hit internal errors"
        )
        refused = standin.call(lambda api: [r for r in api.rejections if "trainjob-operator" in r[0]])
        assert not refused, f"the API refused objects the operator sent: {refused}"


def _is_server_fault(error: Exception) -> bool:
    """An error the stand-in raised while serving, not a client that went away mid-stream (a watch the
    stopping operator closed: writing to its connection fails with a connection reset)."""
    if isinstance(error, ConnectionResetError):
        return False
    return getattr(error, "status", 500) >= 500
