"""KubernetesBackend (the SDK and CLI side) on the real control plane, with the operator running and pods running."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from kubetest.cluster import TrainJobCluster, no_retries, wait_for

from trainjob.api import TrainJob
from trainjob.backends.kubernetes import KubernetesBackendConfig
from trainjob.backends.kubernetes.backend import KubernetesBackend
from trainjob.backends.kubernetes.resources import TRAINJOBS
from trainjob.errors import AlreadyExistsError, JobFailedError, NotFoundError, ValidationError
from trainjob.sdk import types

SCRIPT = str(Path(__file__).resolve().parent / "ddp_script.py")


def manifest(name: str = "mnist", *args: str, runtime: dict | None = None, **trainer: object) -> TrainJob:
    return TrainJob.from_dict(
        {
            "metadata": {"name": name},
            "spec": {
                "runtimeRef": runtime or {"name": "torch-distributed"},
                "trainer": {
                    "numNodes": 2,
                    "numProcPerNode": 1,
                    "command": ["torchrun", SCRIPT, *args],
                    "resourcesPerNode": {"requests": {"cpu": "1"}},
                    **trainer,
                },
            },
        }
    )


@pytest.fixture
def backend(k8s: TrainJobCluster, namespace: str) -> KubernetesBackend:
    return KubernetesBackend(KubernetesBackendConfig(namespace=namespace, config_file=str(k8s.kubeconfig)))


def test_apply_then_follow_the_job_to_completion(backend: KubernetesBackend) -> None:
    created = backend.apply(manifest())
    assert (created.name, created.status, created.num_nodes) == ("mnist", types.CREATED, 2)
    done = backend.wait_for_job_status("mnist", timeout=240, polling_interval=0.5)
    assert done.status == types.COMPLETE and done.runtime_name == "torch-distributed"
    assert [j.name for j in backend.list_jobs()] == ["mnist"]
    assert "JobSetCreated" in [e.reason for e in backend.get_job_events("mnist")]
    lines = [str(line) for line in backend.logs("mnist")]
    assert any(line.startswith("node-0 | rank 0/2") for line in lines), lines[:20]
    assert any(line.startswith("node-1 | rank 1/2") for line in lines), lines[:20]
    assert [line.text for line in backend.logs("mnist", node=1) if line.text.startswith("rank ")][0].startswith(
        "rank 1/2"
    )


def test_waiting_on_a_failed_job_raises_with_the_root_cause(
    k8s: TrainJobCluster, backend: KubernetesBackend, namespace: str
) -> None:
    runtime = k8s.namespaced_runtime(namespace, "no-retries", no_retries)
    backend.apply(manifest("broken", "--fail-rank", "0", runtime={"name": runtime, "kind": "TrainingRuntime"}))
    with pytest.raises(JobFailedError, match="node-0 rank 0: NameError: name 'undefined_learning_rate'"):
        backend.wait_for_job_status("broken", timeout=400, polling_interval=0.5)


def test_apply_rejects_what_the_operator_would_reject_before_sending(
    k8s: TrainJobCluster, backend: KubernetesBackend, namespace: str
) -> None:
    with pytest.raises(ValidationError, match="spec.trainer.numProcPerNode"):
        backend.apply(manifest(numProcPerNode="gpu"))
    with pytest.raises(NotFoundError, match="'nope' not found; known: .*torch-distributed, torch-distributed-volcano"):
        backend.apply(TrainJob.from_dict({"metadata": {"name": "x"}, "spec": {"runtimeRef": {"name": "nope"}}}))
    unreadable_ttl = manifest()
    unreadable_ttl.metadata.annotations = {"trainjob/ttl-seconds-after-finished": "1h"}
    with pytest.raises(ValidationError, match=r"ttl-seconds-after-finished"):  # the operator would ignore it
        backend.apply(unreadable_ttl)
    assert k8s.api.list(TRAINJOBS, namespace) == []


def test_apply_twice_names_the_clash(backend: KubernetesBackend, namespace: str) -> None:
    backend.apply(manifest())
    with pytest.raises(AlreadyExistsError, match=f"'mnist' exists already in namespace '{namespace}'"):
        backend.apply(manifest())
    backend.delete_job("mnist")


def test_suspend_resume_and_delete(k8s: TrainJobCluster, backend: KubernetesBackend, namespace: str) -> None:
    backend.apply(manifest("mnist", "--steps", "400", "--step-seconds", "0.5"))
    backend.suspend_job("mnist")
    assert backend.wait_for_job_status("mnist", {types.SUSPENDED}, timeout=60, polling_interval=0.2)
    backend.resume_job("mnist")
    wait_for(lambda: (js := k8s.jobset("mnist", namespace)) and js["spec"]["suspend"] is False, 30, "resume")
    backend.delete_job("mnist")
    with pytest.raises(NotFoundError, match=f"TrainJob 'mnist' not found in namespace '{namespace}'"):
        backend.get_job("mnist")
    with pytest.raises(NotFoundError):
        backend.delete_job("mnist")
    wait_for(lambda: not k8s.pods("mnist", namespace), 60, "the pods to go")


def test_logs_follow_a_running_node_until_it_ends(backend: KubernetesBackend) -> None:
    backend.apply(manifest("mnist", "--steps", "6", "--step-seconds", "0.5"))
    followed: list[str] = []
    follower = threading.Thread(target=lambda: followed.extend(backend.get_job_logs("mnist", "node-1", follow=True)))
    follower.start()
    follower.join(240)
    assert not follower.is_alive(), "following did not end when the pod finished"
    assert any(line.startswith("node-1 | rank 1/2") for line in followed), followed[:20]
    assert [s.name for s in backend.get_job("mnist").steps] == ["node-0", "node-1"]
    with pytest.raises(ValidationError, match="must be 0..1 for TrainJob mnist, got 5"):
        list(backend.logs("mnist", node=5))


def record_call(path: str, value: int) -> None:
    import os

    with open(f"{path}.{os.environ['RANK']}", "w") as fh:
        fh.write(f"called with {value}")


def test_train_runs_the_function_on_every_node(backend: KubernetesBackend, workdir: Path) -> None:
    out = workdir / "out"
    trainer = types.CustomTrainer(
        func=record_call, func_args={"path": str(out), "value": 7}, num_nodes=2, resources_per_node={"cpu": 1}
    )
    name = backend.train(trainer=trainer)
    backend.wait_for_job_status(name, timeout=240, polling_interval=0.5)
    assert sorted(p.name for p in workdir.glob("out.*")) == ["out.0", "out.1"]
    assert (workdir / "out.1").read_text() == "called with 7"


def test_a_function_source_cannot_reach_a_shell(backend: KubernetesBackend, workdir: Path) -> None:
    """A line in the function's source that would end a shell heredoc is just Python text now."""
    marker = workdir / "marker"
    source_with_heredoc_end = f'''def tricky():
    text = """
TRAINJOB_PROGRAM
touch {marker}
"""
    open("{workdir}/ran", "w").write("yes")
'''
    namespace: dict[str, object] = {}
    exec(compile(source_with_heredoc_end, str(workdir / "tricky.py"), "exec"), namespace)  # noqa: S102
    (workdir / "tricky.py").write_text(source_with_heredoc_end)
    func = namespace["tricky"]
    name = backend.train(trainer=types.CustomTrainer(func=func, num_nodes=1))  # type: ignore[arg-type]
    backend.wait_for_job_status(name, timeout=240, polling_interval=0.5)
    assert (workdir / "ran").read_text() == "yes"
    assert not marker.exists()


def test_config_file_and_namespace_come_from_the_config(k8s: TrainJobCluster) -> None:
    backend = KubernetesBackend(KubernetesBackendConfig(config_file=str(k8s.kubeconfig)))
    assert backend.namespace == "default"
    assert {r.name for r in backend.list_runtimes()} >= {"torch-distributed", "torch-distributed-volcano"}


def test_trainer_client_picks_this_backend_from_the_config(
    k8s: TrainJobCluster, namespace: str, workdir: Path
) -> None:
    from trainjob.sdk.client import TrainerClient

    client = TrainerClient(KubernetesBackendConfig(namespace=namespace, config_file=str(k8s.kubeconfig)))
    name = client.train(
        runtime=client.get_runtime("torch-distributed"),
        trainer=types.CustomTrainer(func=record_call, func_args={"path": str(workdir / "out"), "value": 1}, num_nodes=1),
    )
    wait_for(lambda: k8s.jobset(name, namespace), 30, "the JobSet of the SDK's job")
    assert [job.name for job in client.list_jobs()] == [name]
