"""Dataset and model initializers on this machine: the steps a trainer waits for run as processes before its
nodes, from a real Hub-compatible server and a real S3 server, into ``/workspace`` where the nodes find them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jobtest.tiers import starts
from objectstore.hub import HubServer

from trainjob import (
    CustomTrainer,
    HuggingFaceModelInitializer,
    Initializer,
    LocalProcessBackendConfig,
    S3DatasetInitializer,
    TrainerClient,
)
from trainjob.errors import JobFailedError

REPO = Path(__file__).resolve().parents[3]
DATASET_ROWS = 200


def _dataset(folder: Path) -> Path:
    (folder / "data").mkdir(parents=True)
    rows = "".join(json.dumps({"instruction": f"say {i}", "output": f"{i}"}) + "\n" for i in range(DATASET_ROWS))
    (folder / "data" / "train.jsonl").write_text(rows)
    (folder / "README.md").write_text("# a tiny instruction dataset\n")
    return folder


def _model(folder: Path, weights: int = 200_000) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (folder / "model.safetensors").write_bytes(os.urandom(weights))
    (folder / "pytorch_model.bin").write_bytes(b"left out by the model's default patterns")
    return folder


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """A Hub with a dataset and a model; ``HF_ENDPOINT`` names it where jobs are created (their initializers get
    this machine's download settings)."""
    with HubServer() as server:
        server.add_repo("tatsu-lab/alpaca", _dataset(tmp_path / "alpaca"), repo_type="dataset")
        server.add_repo("org/tiny-llama", _model(tmp_path / "tiny-llama"), repo_type="model")
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no files from an earlier run's Hub cache
        yield server


@pytest.fixture
@starts("procs")
def trainjob_cli(local_jobs: Any) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "trainjob.cli.main", *args], capture_output=True, text=True,
                              timeout=240)
        if check and done.returncode != 0:
            raise AssertionError(f"trainjob {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    return run


def _kubeflow_example(tmp_path: Path, uri: str) -> Path:
    """Kubeflow Trainer v2.3.0's ``examples/yaml/05-multi-step.yaml`` as released, but for its dataset URI."""
    from kubetest.reference import kubeflow_source

    try:
        source = kubeflow_source() / "examples" / "yaml" / "05-multi-step.yaml"
    except LookupError as exc:
        if os.environ.get("TRAINJOB_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"TRAINJOB_REQUIRE_CLUSTER=1 but {exc}")
        pytest.skip(str(exc))
    text = source.read_text()
    assert "storageUri: hf://tatsu-lab/alpaca" in text
    path = tmp_path / "05-multi-step.yaml"
    path.write_text(text.replace("hf://tatsu-lab/alpaca", uri))
    return path


def test_kubeflow_multi_step_example_runs_its_initializer_and_every_node_lists_the_dataset(
        hub: HubServer, trainjob_cli: Callable[..., Any], local_jobs: Any, tmp_path: Path) -> None:
    example = _kubeflow_example(tmp_path, "hf://tatsu-lab/alpaca")
    hub.bytes_per_second = 15_000  # ~3 s for the dataset's 40 kB: two progress samples (one a second) at least
    trainjob_cli("apply", "-f", str(example))
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = local_jobs.get_job("multi-step-example")
        seen.append(f"{job.status} {job.reason} {job.message}")
        if job.status in ("Complete", "Failed"):
            break
        time.sleep(0.1)
    assert job.status == "Complete", seen[-5:]
    progress = [line for line in seen if "Initializing" in line and "% of" in line]
    assert progress, f"no progress was shown while the dataset downloaded: {sorted(set(seen))}"
    assert "dataset-initializer: " in progress[0] and "hf://tatsu-lab/alpaca" in progress[0]
    logs = trainjob_cli("logs", "multi-step-example").stdout
    assert logs.count("Dataset ready at /workspace/dataset (2 entries)") == 2, logs
    assert "initializer did not run" not in logs
    assert "[dataset-initializer] dataset hf://tatsu-lab/alpaca at " in logs
    reasons = [e.reason for e in local_jobs.get_job_events("multi-step-example")]
    assert reasons.index("StepsCompleted") < reasons.index("NodesStarted")
    assert "PodSetSkipped" not in reasons


def test_a_failed_download_fails_the_job_naming_the_uri_and_the_answer_and_no_node_starts(
        hub: HubServer, local_jobs: Any, tmp_path: Path) -> None:
    example = _kubeflow_example(tmp_path, "hf://tatsu-lab/no-such-dataset")
    from trainjob.api.io import load_resources

    resources = load_resources(example)
    started = time.monotonic()
    local_jobs.apply(next(r for r in resources if r.kind == "TrainJob"), [r for r in resources if r.kind != "TrainJob"])
    job = local_jobs.wait_for_job_status("multi-step-example", {"Failed"}, timeout=120, polling_interval=0.2)
    took = time.monotonic() - started
    assert job.reason == "InitializerFailed"
    assert job.message.startswith("dataset-initializer failed: hf://tatsu-lab/no-such-dataset (at http://127.0.0.1:")
    assert "404 repository 'tatsu-lab/no-such-dataset' (dataset) not found" in job.message
    assert took < 60, f"a refused download took {took:.1f} s to fail the job"
    reasons = [e.reason for e in local_jobs.get_job_events("multi-step-example")]
    assert "NodesStarted" not in reasons


def test_the_sdk_train_with_an_initializer_runs_on_the_default_runtime_and_a_second_job_uses_the_cache(
        hub: HubServer, local_jobs: Any, s3: Any) -> None:
    s3.make_bucket("datasets")
    for i in range(3):
        s3.put("datasets", f"alpaca/part-{i}.jsonl", (json.dumps({"i": i}) + "\n").encode() * 1000)

    def train() -> None:
        import os

        import torch.distributed as dist

        dist.init_process_group("gloo")
        data = sorted(os.listdir("/workspace/dataset"))
        model = sorted(os.listdir("/workspace/model"))
        print(f"rank {dist.get_rank()}: dataset {data} model {model}")
        dist.destroy_process_group()

    initializer = Initializer(
        dataset=S3DatasetInitializer(storage_uri="s3://datasets/alpaca", endpoint=s3.endpoint,
                                     access_key_id=s3.access_key, secret_access_key=s3.secret_key),
        model=HuggingFaceModelInitializer(storage_uri="hf://org/tiny-llama"),
    )
    client = TrainerClient(LocalProcessBackendConfig(home=local_jobs.store.home))
    names = []
    for _ in range(2):
        name = client.train(initializer=initializer, trainer=CustomTrainer(func=train, num_nodes=2))
        client.wait_for_job_status(name, timeout=180)
        names.append(name)
    for name in names:
        logs = "\n".join(client.get_job_logs(name))
        assert "dataset ['part-0.jsonl', 'part-1.jsonl', 'part-2.jsonl'] model ['config.json', 'model.safetensors']" \
            in logs, logs
    first, second = ("\n".join(client.get_job_logs(n)) for n in names)
    assert first.count("downloaded in") == 2 and second.count("from the cache (downloaded by an earlier job)") == 2
    planned = [e.message for e in client.get_job_events(names[1]) if e.reason == "StepsPlanned"]
    assert planned == ["before the nodes, in order: dataset-initializer, model-initializer"]


def test_wrong_s3_credentials_fail_the_job_with_the_servers_403(local_jobs: Any, s3: Any) -> None:
    s3.make_bucket("private")
    s3.put("private", "data/train.jsonl", b"{}\n")

    def train() -> None:
        print("never runs")

    client = TrainerClient(LocalProcessBackendConfig(home=local_jobs.store.home))
    started = time.monotonic()
    name = client.train(
        initializer=Initializer(dataset=S3DatasetInitializer(
            storage_uri="s3://private/data", endpoint=s3.endpoint, access_key_id=s3.access_key,
            secret_access_key="not-the-secret")),
        trainer=CustomTrainer(func=train))
    with pytest.raises(JobFailedError) as failed:
        client.wait_for_job_status(name, timeout=120, polling_interval=0.2)
    took = time.monotonic() - started
    message = str(failed.value)
    assert "dataset-initializer failed: s3://private/data (at http://127.0.0.1:" in message
    assert "403 SignatureDoesNotMatch" in message
    assert took < 60
    print(f"403 -> Failed in {took:.1f} s: {message}")


@pytest.fixture(scope="module")
@starts("procs")
def s3() -> Iterator[Any]:
    from objectstore.s3 import S3Server, require_s3_server

    require_s3_server()
    with S3Server() as server:
        yield server


def test_the_cache_is_listed_and_pruned_from_the_cli(hub: HubServer, trainjob_cli: Callable[..., Any],
                                                    local_jobs: Any, tmp_path: Path) -> None:
    example = _kubeflow_example(tmp_path, "hf://tatsu-lab/alpaca")
    trainjob_cli("apply", "-f", str(example))
    local_jobs.wait_for_job_status("multi-step-example", timeout=120, polling_interval=0.2)
    listed = trainjob_cli("cache", "list", "-o", "json").stdout
    entries = json.loads(listed)
    assert [(e["uri"], e["kind"], e["files"]) for e in entries] == [("hf://tatsu-lab/alpaca", "dataset", 2)]
    table = trainjob_cli("cache", "list").stdout
    assert "hf://tatsu-lab/alpaca" in table and entries[0]["key"][:12] in table
    pruned = trainjob_cli("cache", "prune", "--all").stdout
    assert "removed 1 entr" in pruned
    assert json.loads(trainjob_cli("cache", "list", "-o", "json").stdout) == []
    # the job's own files were links: pruning the cache leaves them in place
    workspace = Path(local_jobs.store.job_dir("multi-step-example")) / "workspace" / "dataset"
    assert (workspace / "data" / "train.jsonl").read_text().count("\n") == DATASET_ROWS
