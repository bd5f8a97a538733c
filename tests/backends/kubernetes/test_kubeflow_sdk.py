"""The real Kubeflow SDK (``kubeflow`` on PyPI) against trainjob's operator, as its documentation uses it.

``TrainerClient`` reads the status only from the TrainJob's conditions and pods: Running when the job has no
conditions and every ``node`` pod runs, Failed from a True ``Failed`` condition. These tests hold the operator to
that reading, and the built-in runtime to failing a job whose code raises within seconds instead of retrying it.
Functions reach the pods inside the SDK's own ``bash -c`` heredoc; pods have no network, so no packages.
"""

from __future__ import annotations

import logging
import time

import pytest
from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import CustomTrainer, TrainerClient
from kubetest.cluster import TrainJobCluster

from trainjob.backends.kubernetes.resources import TRAINJOBS


def ddp_on_cpu() -> None:
    """The Kubeflow example in small: DDP with gloo on CPU, a few steps, every rank says where it is."""
    import os
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    time.sleep(3)  # long enough for a client polling every second to see the job Running
    print(f"rank {rank} of {dist.get_world_size()} done on {os.environ.get('HOSTNAME')}", flush=True)
    dist.destroy_process_group()


def raises_on_rank_1() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise NameError("name 'lr' is not defined")
    dist.barrier()


def trainer_client(k8s: TrainJobCluster, namespace: str) -> TrainerClient:
    return TrainerClient(backend_config=KubernetesBackendConfig(namespace=namespace, config_file=str(k8s.kubeconfig)))


@pytest.fixture
def client(k8s: TrainJobCluster, namespace: str) -> TrainerClient:
    return trainer_client(k8s, namespace)


def test_a_ddp_function_runs_and_the_sdk_sees_each_status(
    k8s: TrainJobCluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        client = trainer_client(k8s, namespace)
    assert "kubeflow_trainer_version" not in caplog.text, "the SDK finds the version ConfigMap trainjob installs"
    # The seed's call, scaled to this machine: 2 nodes of 2 CPUs, so 2 processes each (numProcPerNode auto).
    name = client.train(trainer=CustomTrainer(func=ddp_on_cpu, num_nodes=2, resources_per_node={"cpu": 2}))

    running = client.wait_for_job_status(name, status={"Running"}, timeout=180, polling_interval=1)
    assert running.status == "Running"
    done = client.wait_for_job_status(name, timeout=180, polling_interval=1)
    assert done.status == "Complete"

    for node in (0, 1):  # node 0 runs ranks 0 and 1, node 1 ranks 2 and 3
        text = "\n".join(client.get_job_logs(name, step=f"node-{node}", follow=True))
        for rank in (2 * node, 2 * node + 1):
            assert f"rank {rank} of 4 done" in text, text[-2000:]
    reasons = {event.reason for event in client.get_job_events(name)}
    assert "JobSetCreated" in reasons, reasons
    client.delete_job(name)


def test_a_function_that_raises_fails_the_job_within_a_minute(
    client: TrainerClient, k8s: TrainJobCluster, namespace: str
) -> None:
    submitted = time.monotonic()
    name = client.train(trainer=CustomTrainer(func=raises_on_rank_1, num_nodes=2, resources_per_node={"cpu": 1}))

    with pytest.raises(Exception, match="Failed") as failed:
        client.wait_for_job_status(name, timeout=60, polling_interval=1)
    took = time.monotonic() - submitted
    print(f"submission to Failed through the Kubeflow SDK: {took:.1f} s")
    assert took < 60, failed.value
    assert client.get_job(name).status == "Failed"
    condition = next(c for c in k8s.api.get(TRAINJOBS, namespace, name)["status"]["conditions"] if c["type"] == "Failed")
    assert "NameError: name 'lr' is not defined" in condition["message"], condition
    client.delete_job(name)


def test_an_image_that_cannot_be_pulled_fails_the_sdks_wait_naming_it(
    client: TrainerClient, k8s: TrainJobCluster, namespace: str
) -> None:
    """Seed 000's call with ``CustomTrainer(image=...)`` naming an image the registry lacks: ``wait_for_job_status``
    raises Failed (about 45 s after the submission on an idle machine: 10 s before the pods are looked at, 30 s of
    grace), and kubectl and ``trainjob get`` say why."""
    image = "registry.trainjob.test/trainjob/no-such-image:v1"
    submitted = time.monotonic()
    name = client.train(trainer=CustomTrainer(func=ddp_on_cpu, image=image, num_nodes=1,
                                              resources_per_node={"cpu": 1}))
    with pytest.raises(Exception, match="Failed"):
        client.wait_for_job_status(name, timeout=180, polling_interval=1)
    took = time.monotonic() - submitted
    assert client.get_job(name).status == "Failed"
    condition = next(c for c in k8s.api.get(TRAINJOBS, namespace, name)["status"]["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "PodCannotStart" and f"(image {image})" in condition["message"], condition
    listed = k8s.kubectl("get", "trainjobs", "-n", namespace).stdout
    assert name in listed and "Failed" in listed, listed
    shown = k8s.trainjob("get", name, "--backend", "kubernetes", f"--kubeconfig={k8s.kubeconfig}", "-n", namespace)
    assert "Failed (PodCannotStart)" in shown.stdout and f"(image {image})" in shown.stdout, shown.stdout
    print(f"submission to Failed through the Kubeflow SDK, image not found: {took:.1f} s\n{listed}")
    client.delete_job(name)
