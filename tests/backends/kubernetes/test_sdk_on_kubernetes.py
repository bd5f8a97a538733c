"""The Kubeflow SDK's calls against the real control plane: a failed function names its rank and exception, and
options and container trainers reach the TrainJob and its JobSet."""

from __future__ import annotations

import pytest
from kubetest.cluster import TrainJobCluster, no_retries

from trainjob.backends.kubernetes import KubernetesBackendConfig
from trainjob.backends.kubernetes.backend import KubernetesBackend
from trainjob.backends.kubernetes.resources import TRAINJOBS
from trainjob.errors import JobFailedError
from trainjob.sdk import types
from trainjob.sdk.options import Annotations, Labels, Name, RuntimePatch, TrainerCommand


@pytest.fixture
def backend(k8s: TrainJobCluster, namespace: str) -> KubernetesBackend:
    return KubernetesBackend(KubernetesBackendConfig(namespace=namespace, config_file=str(k8s.kubeconfig)))


def raises_after_init() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise NameError("name 'lr' is not defined")  # an undefined name itself is refused at submit
    dist.barrier()


def test_a_failed_function_names_its_rank_and_exception(
    k8s: TrainJobCluster, backend: KubernetesBackend, namespace: str
) -> None:
    runtime = k8s.namespaced_runtime(namespace, "no-retries", no_retries)
    name = backend.train(runtime=runtime, trainer=types.CustomTrainer(
        func=raises_after_init, num_nodes=2, resources_per_node={"cpu": 1}))

    with pytest.raises(JobFailedError, match=r"TrainJob \S+ failed: ") as failed:
        backend.wait_for_job_status(name, timeout=400, polling_interval=0.5)

    assert "node-1 rank 1: NameError: name 'lr' is not defined" in str(failed.value)
    condition = next(c for c in k8s.api.get(TRAINJOBS, namespace, name)["status"]["conditions"] if c["type"] == "Failed")
    assert condition["message"].startswith("node-1 rank 1: NameError: name 'lr' is not defined")


def test_options_and_a_container_trainer_reach_the_trainjob_and_its_pods(
    k8s: TrainJobCluster, backend: KubernetesBackend, namespace: str
) -> None:
    patch = {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
        "metadata": {"labels": {"patched": "yes"}}}}}}]}}}
    name = backend.train(
        trainer=types.CustomTrainerContainer(image=k8s.cp.training_image, num_nodes=1, env={"GREETING": "hi"}),
        options=[Name("from-options"), Labels({"team": "vision"}), Annotations({"note": "sdk"}),
                 TrainerCommand(["python", "-c", "import os; print(os.environ['GREETING'], flush=True)"]),
                 RuntimePatch(training_runtime_spec=patch)],
    )

    assert name == "from-options"
    job = backend.wait_for_job_status(name, timeout=240, polling_interval=0.5)
    assert job.resource["metadata"]["labels"]["team"] == "vision"
    assert job.resource["metadata"]["annotations"]["note"] == "sdk"
    assert job.resource["spec"]["runtimePatches"][0]["manager"] == "trainer.kubeflow.org/kubeflow-sdk"
    assert job.resource["spec"]["trainer"]["image"] == k8s.cp.training_image
    assert {pod["metadata"]["labels"].get("patched") for pod in k8s.pods(name, namespace)} == {"yes"}
    # the SDK's log lines carry the prefix `trainjob logs` prints
    assert "node-0 | hi" in list(backend.get_job_logs(name))
