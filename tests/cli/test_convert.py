"""``trainjob convert`` and PyTorchJobs through ``render``, ``apply``, ``check`` and ``get pytorchjob``: the seeds'
four PyTorchJobs run locally once their train.py is a small gloo script."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainjob.convert import load_resources

HERE = Path(__file__).resolve().parent
SEED_COPIES = HERE.parent / "api" / "seed_manifests"
SEEDS = {p.stem: p for p in sorted(SEED_COPIES.glob("*.yml"))}
GLOO_SCRIPT = HERE / "gloo_allreduce.py"


def test_convert_prints_the_runtime_and_trainjob_as_yaml_with_a_note_and_warnings(cli):
    code, out, err = cli("convert", "-f", str(SEEDS["003-0"]))
    assert code == 0
    runtime, trainjob = yaml.safe_load_all(out)
    assert (runtime["kind"], trainjob["kind"]) == ("TrainingRuntime", "TrainJob")
    assert trainjob["spec"]["runtimeRef"] == {"name": "ddp-training", "apiGroup": "trainer.kubeflow.org",
                                              "kind": "TrainingRuntime"}
    assert err.splitlines()[0] == "note: converted from kubeflow.org/v1 PyTorchJob ddp-training"
    assert "warning: PyTorchJob ddp-training: spec.pytorchReplicaSpecs.Master.template.spec.containers[0].command: " \
           "--master-port=23456 is left out" in err


def test_convert_reads_several_files_and_stdin_and_prints_json(cli, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(SEEDS["004-0"].read_text()))
    code, out, _ = cli("convert", "-f", str(SEEDS["004-1"]), "-f", "-", "-o", "json")
    assert code == 0
    listing = json.loads(out)
    assert listing["kind"] == "List"
    assert [(i["kind"], i["metadata"]["name"]) for i in listing["items"]] == [
        ("TrainingRuntime", "pytorch-ddp-multi-node"), ("TrainJob", "pytorch-ddp-multi-node"),
        ("TrainingRuntime", "pytorch-ddp-single-node"), ("TrainJob", "pytorch-ddp-single-node")]


def test_convert_output_loads_back_as_the_same_resources(cli, tmp_path):
    two = tmp_path / "two.yaml"
    two.write_text(SEEDS["002-0"].read_text() + "\n---\n" + SEEDS["004-1"].read_text())
    code, out, _ = cli("convert", "-f", str(two))
    assert code == 0
    assert load_resources(out) == load_resources(two)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: a}\n",
         "kind: convert takes kubeflow.org/v1 PyTorchJobs, got 'TrainJob'"),
        ("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: a}\nspec: {pytorchReplicaSpecs: {}}\n",
         "spec.pytorchReplicaSpecs: needs a Master or a Worker replica spec"),
        ("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: a}\n"
         "spec: {pytorchReplicaSpecs: {Launcher: {template: {}}}}\n", "unknown replica type 'Launcher'"),
        ("kind: [unclosed\n", "not valid YAML"),
        ("", "no documents"),
    ],
)
def test_convert_refuses_bad_input_with_exit_2_naming_the_file(cli, tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code, out, err = cli("convert", "-f", str(path))
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {path}: ") and message in err


def test_render_takes_a_pytorchjob_and_says_it_was_converted(cli):
    code, out, err = cli("render", "-f", str(SEEDS["002-0"]))
    assert code == 0
    (jobset,) = yaml.safe_load_all(out)
    assert jobset["kind"] == "JobSet" and jobset["metadata"]["name"] == "llm-training"
    assert jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 4
    assert "note: converted from kubeflow.org/v1 PyTorchJob llm-training" in err


def test_check_flags_the_seed_without_dev_shm(cli):
    code, out, _ = cli("check", str(SEEDS["003-0"]), str(SEEDS["002-0"]))
    assert code == 1  # TJ017 is an error
    assert out.count("TJ017") == 1 and "TrainJob ddp-training: 8 GPUs per node" in out


# -- the seeds, run locally ---------------------------------------------------------------------------------------

def runnable(name: str, tmp_path: Path) -> Path:
    """The seed's PyTorchJob as a user would try it on a laptop: train.py replaced by a gloo script, one process
    per node, two nodes at most, no GPU or memory requests, memory-backed volumes of 1Gi (not 64Gi). Everything
    else (volumes, env, tolerations ...) stays."""
    (data,) = yaml.safe_load_all(SEEDS[name].read_text())
    spec = data["spec"]
    for replica_type, replica in spec["pytorchReplicaSpecs"].items():
        if replica_type == "Worker":
            replica["replicas"] = 2 if "Master" not in spec["pytorchReplicaSpecs"] else 1
        for container in replica["template"]["spec"]["containers"]:
            container.pop("resources", None)
        for volume in replica["template"]["spec"].get("volumes") or []:
            if "sizeLimit" in volume.get("emptyDir", {}):
                volume["emptyDir"]["sizeLimit"] = "1Gi"
            for field in ("command", "args"):
                container[field] = [_runnable_token(t) for t in container.get(field) or []]
    if "elasticPolicy" in spec:
        spec["elasticPolicy"]["maxReplicas"] = 2
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _runnable_token(token: str) -> str:
    if token == "train.py":
        return str(GLOO_SCRIPT)
    if token.startswith("--nproc_per_node="):
        return "--nproc_per_node=1"
    return token


EXPECTED_WORLD = {"002-0": 2, "003-0": 2, "004-0": 1, "004-1": 2}


@pytest.mark.parametrize("name", sorted(EXPECTED_WORLD))
def test_seed_pytorchjob_runs_locally_with_a_replaced_script(local_jobs, cli, tmp_path, name):
    path = runnable(name, tmp_path)
    job_name = yaml.safe_load(path.read_text())["metadata"]["name"]
    code, out, err = cli("apply", "-f", str(path))
    assert (code, out) == (0, f"trainjob/{job_name} created\n"), err
    code, out, err = cli("wait", job_name, "--timeout", "240")
    logs = cli("logs", job_name)[1]
    assert code == 0, f"{out}{err}\n{logs}"
    assert f"allreduce ok world={EXPECTED_WORLD[name]}" in logs
    code, out, _ = cli("get", "pytorchjob", job_name, "-o", "json")
    assert code == 0
    resource: dict[str, Any] = json.loads(out)
    assert resource["metadata"]["annotations"]["trainjob/converted-from"] == "kubeflow.org/v1 PyTorchJob"


def test_get_pytorchjob_refuses_a_trainjob_that_was_not_converted(cli, tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: plain}\n"
                     "spec: {runtimeRef: {name: torch-distributed}, suspend: true,\n"
                     "  trainer: {command: [python, -c, 'pass']}}\n")
    assert cli("apply", "-f", str(plain))[0] == 0
    code, _, err = cli("get", "pytorchjob", "plain")
    assert code == 2 and "pytorchjob 'plain' not found: trainjob/plain exists but was not converted" in err
    assert cli("get", "trainjob", "plain")[0] == 0
    code, _, err = cli("get", "tfjob", "plain")
    assert code == 2 and "unknown kind 'tfjob'" in err
    code, _, err = cli("get", "pytorchjob", "nobody")
    assert code == 2 and "nobody" in err
    code, _, err = cli("describe", "pytorchjob", "plain")
    assert code == 2 and "was not converted from a PyTorchJob" in err
    assert cli("describe", "trainjob", "plain")[0] == 0


def test_get_and_describe_pytorchjob_show_the_converted_job(local_jobs, cli, tmp_path):
    # local_jobs: creating even a suspended job probes once whether this machine can give a node its own mounts
    path = runnable("004-0", tmp_path)
    (data,) = yaml.safe_load_all(path.read_text())
    data["spec"]["runPolicy"] = {"suspend": True}  # created, never started: nothing to wait for
    path.write_text(yaml.safe_dump(data))
    assert cli("apply", "-f", str(path))[0] == 0
    code, out, _ = cli("get", "pytorchjob", "pytorch-ddp-single-node")
    assert code == 0 and "pytorch-ddp-single-node" in out
    code, out, _ = cli("describe", "pytorchjobs", "pytorch-ddp-single-node")
    assert code == 0 and "kubeflow.org/v1 PyTorchJob" in out


def test_run_follows_a_pytorchjob_file_to_its_end(local_jobs, cli, tmp_path):
    path = runnable("004-0", tmp_path)
    job_name = yaml.safe_load(path.read_text())["metadata"]["name"]
    code, out, err = cli("run", "-f", str(path))
    assert code == 0, err
    assert "note: converted from kubeflow.org/v1 PyTorchJob" in err
    assert f"trainjob/{job_name} Complete" in err
    assert "allreduce ok world=1" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run"], "SCRIPT: missing: give a training script"),
        (["run", "train.py", "-f", "job.yaml"], "give a script or -f FILE, not both"),
    ],
)
def test_run_takes_a_script_or_a_file(cli, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text("kind: TrainJob\n")
    code, out, err = cli(*argv)
    assert code == 2 and message in err, err
