"""``trainjob operator``'s flags become one :class:`~trainjob.backends.kubernetes.operator.OperatorOptions`, each
flag in the field named as its option; the defaults are the dataclass's."""

from __future__ import annotations

import pytest

from trainjob.backends.kubernetes import operator as operator_module
from trainjob.backends.kubernetes.config import KubernetesBackendConfig
from trainjob.backends.kubernetes.operator import OperatorOptions


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[OperatorOptions]:
    """What ``trainjob operator`` hands :func:`~trainjob.backends.kubernetes.operator.run_operator` (which does not
    run)."""
    calls: list[OperatorOptions] = []
    monkeypatch.setattr(operator_module, "run_operator", calls.append)
    return calls


def test_the_flags_fill_the_options(cli, ran: list[OperatorOptions]) -> None:
    code, _, err = cli("operator", "--kubeconfig", "/tmp/kc", "--context", "prod", "--namespace", "a",
                       "--namespace", "b", "--workers", "8", "--liveness", "http://0.0.0.0:8080/healthz",
                       "--status-url", "https://op.svc:9443", "--status-port", "9443", "--leader-elect",
                       "--lease-duration", "20", "--renew-deadline", "12", "--retry-period", "3",
                       "--metrics-port", "9090")
    assert code == 0, err
    assert ran == [OperatorOptions(
        config=KubernetesBackendConfig(config_file="/tmp/kc", context="prod"), workers=8, namespaces=("a", "b"),
        liveness="http://0.0.0.0:8080/healthz", status_url="https://op.svc:9443", status_port=9443,
        leader_elect=True, lease_duration=20.0, renew_deadline=12.0, retry_period=3.0, metrics_port=9090)]


def test_without_flags_the_options_are_the_defaults(cli, ran: list[OperatorOptions]) -> None:
    code, _, err = cli("operator")
    assert code == 0, err
    assert ran == [OperatorOptions()]
