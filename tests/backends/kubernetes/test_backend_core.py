"""What both backends do the same way (:class:`trainjob.backends.base.BackendCore`): SDK trainers checked before
anything is created, steps mapped to nodes, runtimes viewed and jobs summarized alike.

No cluster needed: the Kubernetes backend talks to a stand-in API that serves the built-in runtimes and keeps what
is created; the local backend runs in a fresh ``$TRAINJOB_HOME``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainjob.backends.kubernetes.backend import KubernetesBackend
from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.errors import ValidationError
from trainjob.runtime import builtin_runtimes
from trainjob.sdk import types


class StandInApi:
    """The few API calls the backend makes, answered from the built-in runtimes and the jobs created."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.jobs: dict[str, dict[str, Any]] = {}

    def get(self, ref: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get {ref.kind} {name}")
        if ref.kind == "ClusterTrainingRuntime":
            runtime = builtin_runtimes().get(name)
            return runtime.to_dict() if runtime is not None else None
        return self.jobs.get(name) if ref.kind == "TrainJob" else None

    def list(self, ref: Any, namespace: str | None = None, label_selector: str | None = None) -> list[dict[str, Any]]:
        self.calls.append(f"list {ref.kind}")
        if ref.kind == "ClusterTrainingRuntime":
            return [runtime.to_dict() for runtime in builtin_runtimes().values()]
        return list(self.jobs.values()) if ref.kind == "TrainJob" else []

    def create(self, body: dict[str, Any], ref: Any) -> dict[str, Any]:
        self.calls.append(f"create {ref.kind}")
        created = {**body, "metadata": {**body["metadata"], "creationTimestamp": "2025-01-01T00:00:00Z"}}
        self.jobs[body["metadata"]["name"]] = created
        return created

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return []


@pytest.fixture
def kubernetes() -> KubernetesBackend:
    made = KubernetesBackend.__new__(KubernetesBackend)
    made.namespace, made.api, made.pod_start_timeout = "ml", StandInApi(), 1.0  # type: ignore[assignment]
    return made


@pytest.fixture
def local(tmp_path: Path) -> LocalBackend:
    return LocalBackend(LocalProcessBackendConfig(home=tmp_path / "home"))


def refusal(backend: Any, trainer: types.CustomTrainer) -> str:
    with pytest.raises(ValidationError) as caught:
        backend.train(trainer=trainer)
    return str(caught.value)


def decorated(func: Any) -> Any:
    return func


@decorated
def train_with_args(epochs: int) -> None:
    print(epochs)


@pytest.mark.parametrize(
    ("trainer", "match"),
    [
        (types.CustomTrainer(func=lambda: None), "trainer.func: must be a function defined with def"),
        (types.CustomTrainer(func=train_with_args, func_args={"epoch": 2}), "trainer.func_args: do not match"),
        (types.CustomTrainer(func=train_with_args, func_args={"epochs": object()}),
         "trainer.func_args: must be JSON-serializable"),
    ],
)
def test_both_backends_refuse_a_function_that_cannot_run_alike_before_creating_anything(
    kubernetes, local, trainer, match
):
    message = refusal(kubernetes, trainer)
    assert message.startswith(match), message
    assert message == refusal(local, trainer)
    assert kubernetes.api.calls == []  # refused before the API server was asked anything
    assert local.list_jobs() == []


def test_a_decorated_function_runs_undecorated_on_kubernetes_too(kubernetes):
    name = kubernetes.train(trainer=types.CustomTrainer(func=train_with_args, func_args={"epochs": 2}))
    env = {e["name"]: e["value"] for e in kubernetes.api.jobs[name]["spec"]["trainer"]["env"]}
    assert "@decorated" not in env["TRAINJOB_PROGRAM"] and "def train_with_args" in env["TRAINJOB_PROGRAM"]


def test_a_step_the_job_does_not_have_is_the_same_error_on_both_backends(kubernetes, local):
    from trainjob.api import TrainJob

    manifest = {"metadata": {"name": "grid"}, "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True,
                                                      "trainer": {"numNodes": 2, "numProcPerNode": 1,
                                                                  "command": ["python", "-c", "pass"]}}}
    kubernetes.apply(TrainJob.from_dict(manifest))
    local.apply(TrainJob.from_dict(manifest))
    for step in ("node-2", "worker-0", "node-x"):
        messages = []
        for backend in (kubernetes, local):
            with pytest.raises(ValidationError) as caught:
                backend.get_job_logs("grid", step)
            messages.append(str(caught.value))
        assert messages[0] == messages[1] == f"step: must be one of node-0, node-1 for TrainJob grid, got {step!r}"
    assert [s.name for s in kubernetes.list_summaries()] == [s.name for s in local.list_summaries()] == ["grid"]
    k8s_summary, local_summary = kubernetes.list_summaries()[0], local.list_summaries()[0]
    assert (k8s_summary.num_nodes, k8s_summary.num_proc_per_node, k8s_summary.runtime) == (2, 1, "torch-distributed")
    assert (local_summary.num_nodes, local_summary.num_proc_per_node, local_summary.runtime) == (2, 1, "torch-distributed")


def test_both_backends_view_the_same_runtime_alike(kubernetes, local):
    assert kubernetes.list_runtimes() == local.list_runtimes()
    torch = local.get_runtime("torch-distributed")
    assert kubernetes.get_runtime("torch-distributed") == torch
    assert (torch.trainer.framework, torch.trainer.device_count, torch.trainer.num_nodes) == ("torch", "auto", 1)
    assert kubernetes.get_runtime("deepspeed-distributed").trainer.framework == "deepspeed"  # its label, as the SDK
