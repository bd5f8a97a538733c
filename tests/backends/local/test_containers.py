"""Local jobs whose nodes run as containers of the job's image (``trainjob run --image``), on Podman.

The image is the test cluster's training image (``deploy/training.Dockerfile``: torch at the lock's version and the
examples), built with buildah into the image cache (:mod:`kubetest.images`), where Podman finds it through
``CONTAINERS_STORAGE_CONF``. Every test leaves no container and no network behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobtest.tiers import starts
from jobtest.waiting import wait_until

from trainjob.backends.local.client.backend import LocalBackend
from trainjob.backends.local.containers import JOB_LABEL, EngineError
from trainjob.cli.main import main
from trainjob.errors import NotFoundError

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "digits_ddp.py"


PODMAN = shutil.which("podman") or "podman"  # found once: a test takes PATH away


def _podman(*args: str) -> str:
    return subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=120).stdout


def _leftovers() -> dict[str, list[str]]:
    containers = _podman("ps", "--all", "--format", "{{.Names}}", "--filter", f"label={JOB_LABEL}").split()
    networks = [n for n in _podman("network", "ls", "--format", "{{.Name}}").split() if n.startswith("trainjob-")]
    return {"containers": containers, "networks": networks}


@pytest.fixture(scope="module")
@starts("procs")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The training image, in the image cache's storage, which Podman is pointed at for this module's tests."""
    missing = [tool for tool in ("podman", "buildah") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        why = f"needs root and {', '.join(missing) or 'podman, buildah'} (rootful Podman runs the containers)"
        if os.environ.get("TRAINJOB_REQUIRE_CLUSTER"):
            pytest.fail(why)
        pytest.skip(why)
    from kubetest.images import Builder, _locked, cache_dir

    builder = Builder(cache_dir(), cache_dir() / "build.log")
    with _locked(cache_dir() / ".lock"):  # built by scripts/test.sh beforehand; else now (minutes)
        reference = builder.training(builder.base())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CONTAINERS_STORAGE_CONF", str(builder.storage_conf(tmp_path_factory.mktemp("podman") / "storage.conf")))
        patch.delenv("TRAINJOB_CONTAINER_ENGINE", raising=False)
        before = _leftovers()
        yield reference
        assert _leftovers() == before


@pytest.fixture
def backend(image: str, local_jobs: LocalBackend) -> LocalBackend:
    return local_jobs


def _final_accuracy(out: str) -> float:
    return float(out.split("final test accuracy ")[1].split()[0])


def test_the_digits_example_in_its_image_trains_to_the_accuracy_of_process_nodes(backend, image, capsys):
    args = ["--nodes", "2", "--nproc-per-node", "2", "--", "--epochs", "12"]
    code = main(["run", "examples/digits_ddp.py", "--image", image, "--name", "in-image", *args])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "node-0/rank-0 | training on 4 processes" in out
    events = {e.reason: e.message for e in backend.get_job_events("in-image")}
    assert "ContainersUsed" in events and image in events["ContainersUsed"]
    assert "rendezvous at in-image-node-0-0:" in events["NodesStarted"]
    job = backend.get_job("in-image")
    assert job.status == "Complete" and job.progress.step == job.progress.total_steps
    assert (backend.store.job_dir("in-image") / "checkpoints" / "checkpoint.pt").is_file()  # the job's dir, mounted
    code = main(["run", str(EXAMPLE), "--name", "as-processes", *args])
    processes = capsys.readouterr().out
    assert code == 0, processes[-3000:]
    print(f"final test accuracy: {_final_accuracy(out)} in containers, {_final_accuracy(processes)} as processes")
    assert _final_accuracy(out) == _final_accuracy(processes) >= 0.9


OOM = """
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    hog = []
    while True:
        hog.append(bytearray(32 * 2**20))
        for page in range(0, len(hog[-1]), 4096):
            hog[-1][page] = 1
dist.barrier()
"""


def test_a_node_over_its_memory_limit_is_oom_killed_and_the_job_names_it(backend, image, tmp_path, capsys):
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "greedy"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {
            "image": image, "numNodes": 2, "numProcPerNode": 1,
            "command": ["torchrun", "--no-python", "python", "-c", OOM],
            "resourcesPerNode": {"limits": {"memory": "600Mi"}}}},
    }
    (tmp_path / "greedy.yaml").write_text(json.dumps(job))
    assert main(["apply", "-f", str(tmp_path / "greedy.yaml"), "--containers"]) == 0
    failed = backend.wait_for_job_status("greedy", {"Failed"}, timeout=180)
    print(failed.message)
    assert "node-1" in failed.message and "OOMKilled" in failed.message
    assert "trainjob-greedy-node-1-" in failed.message and "600Mi" in failed.message
    assert main(["describe", "greedy"]) == 0
    assert "OOMKilled" in capsys.readouterr().out


SLEEPER = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
print("ready", flush=True)
def wait_here():
    time.sleep(600)
wait_here()
"""


def test_stacks_top_and_delete_reach_the_ranks_in_the_containers(backend, image, tmp_path, capsys):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    volume = {"name": "code", "hostPath": {"path": str(tmp_path), "type": "Directory"}}
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "sleeper"},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"image": image, "numNodes": 2, "numProcPerNode": 1,
                             "command": ["torchrun", "/code/sleeper.py"]},
                 "podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {
                     "volumes": [volume],
                     "containers": [{"name": "node", "volumeMounts": [{"name": "code", "mountPath": "/code",
                                                                       "readOnly": True}]}]}}]},
    }
    (tmp_path / "sleeper.yaml").write_text(json.dumps(job))
    assert main(["apply", "-f", str(tmp_path / "sleeper.yaml"), "--containers"]) == 0
    wait_until(lambda: all(any("ready" in line for line in backend.get_job_logs("sleeper", f"node-{node}"))
                           for node in (0, 1)), timeout=120, what="both ranks ready")
    capsys.readouterr()
    assert main(["stacks", "sleeper"]) == 0
    stacks = capsys.readouterr().out
    assert "rank 0" in stacks and "rank 1" in stacks and "wait_here" in stacks, stacks[-2000:]
    assert main(["top", "job", "sleeper"]) == 0
    top = capsys.readouterr().out
    assert "node-1" in top and "rank" in top.lower(), top
    names = _podman("ps", "--format", "{{.Names}}", "--filter", f"label={JOB_LABEL}={backend.store.job_dir('sleeper')}")
    assert len(names.split()) == 2
    started = time.monotonic()
    backend.delete_job("sleeper")
    print(f"deleted in {time.monotonic() - started:.1f} s")
    with pytest.raises(NotFoundError):
        backend.get_job("sleeper")
    assert _podman("ps", "--all", "--quiet", "--filter", f"label={JOB_LABEL}={backend.store.job_dir('sleeper')}") == ""


BAD_INPUT = [
    pytest.param({"TRAINJOB_CONTAINER_ENGINE": "docker"}, None, "docker: ", id="an engine without its daemon"),
    pytest.param({"TRAINJOB_CONTAINER_ENGINE": "crio"}, None, "must be one of docker, podman, got 'crio'",
                 id="an unknown engine"),
    pytest.param({"PATH": "/nonexistent"}, None, "docker: not installed; podman: not installed",
                 id="no engine installed"),
    pytest.param({}, "localhost/trainjob-test/no-such-image:1",
                 "image localhost/trainjob-test/no-such-image:1 is not on this machine (podman) and could not be pulled",
                 id="an image that does not exist"),
]


@pytest.mark.parametrize(("env", "reference", "said"), BAD_INPUT)
def test_bad_input_is_refused_naming_it_and_creates_nothing(backend, image, monkeypatch, capsys, env, reference, said):
    from trainjob.api import TrainJob

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    job = TrainJob.from_dict({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "refused"},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"image": reference or image, "command": ["torchrun", "train.py"]}}})
    with pytest.raises(EngineError) as refused:
        backend.apply(job, containers=True)
    assert said in str(refused.value)
    with pytest.raises(NotFoundError):
        backend.get_job("refused")
    assert not backend.store.job_dir("refused").exists()
    assert main(["run", "train.py", "--image", reference or image, "--name", "refused", "--detach"]) != 0
    assert said in capsys.readouterr().err
    with pytest.raises(NotFoundError):
        backend.get_job("refused")
    assert _leftovers()["networks"] == []


def train_pytorch():
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    device, backend = ("cuda", "nccl") if torch.cuda.is_available() else ("cpu", "gloo")
    dist.init_process_group(backend=backend)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    model = DDP(torch.nn.Linear(10, 10).to(device))
    model(torch.randn(4, 10)).sum().backward()
    print(f"Training on rank {dist.get_rank()}/{dist.get_world_size()} (local rank {local_rank})")
    dist.destroy_process_group()


def test_the_seed_000_sdk_example_runs_in_its_image_with_container_backend_config(backend, image):
    from trainjob import ContainerBackendConfig, CustomTrainer, TrainerClient

    client = TrainerClient(ContainerBackendConfig(container_runtime="podman"))
    job_id = client.train(trainer=CustomTrainer(func=train_pytorch, num_nodes=2, image=image,
                                                resources_per_node={"cpu": 1, "memory": "2Gi"}))
    job = client.wait_for_job_status(job_id, timeout=300)
    assert job.status == "Complete"
    logs = [line for step in ("node-0", "node-1") for line in client.get_job_logs(job_id, step=step, follow=True)]
    assert any("Training on rank 0/2" in line for line in logs) and any("Training on rank 1/2" in line for line in logs)
    assert any(e.reason == "ContainersUsed" for e in client.get_job_events(job_id))


def test_a_script_the_image_does_not_have_fails_the_job_naming_the_path(backend, image, capsys):
    code = main(["run", "train_typo.py", "--image", image, "--name", "typo"])
    assert code != 0
    job = backend.get_job("typo")
    assert job.status == "Failed"
    assert "can't open file '/workspace/train_typo.py'" in job.message, job.message  # the image's WORKDIR
