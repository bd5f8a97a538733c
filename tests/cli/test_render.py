"""``trainjob render``: objects or plan on stdout; bad input gives exit code 2 and one clear line on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trainjob.cli.main import EXIT_BAD_INPUT, cli

JOB = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: mnist
spec:
  runtimeRef:
    name: {runtime}
  trainer:
    command: [torchrun, train.py]
    numNodes: {num_nodes}
    numProcPerNode: {nproc}
    env:
      - name: {env}
        value: "1"
"""
RUNTIME = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: gang
spec:
  mlPolicy: {torch: {}}
  podGroupPolicy: {coscheduling: {}}
  template:
    spec:
      replicatedJobs:
        - name: node
          template: {spec: {template: {spec: {containers: [{name: node, image: "torch:1"}]}}}}
"""


def _job(tmp_path: Path, **fields) -> Path:
    values = {"runtime": "torch-distributed", "num_nodes": 2, "nproc": 2, "env": "NCCL_DEBUG", **fields}
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(**values))
    return path


def _render(*args: str):
    return CliRunner().invoke(cli, ["render", *args])


def test_render_prints_the_jobset_as_yaml(tmp_path):
    result = _render("-f", str(_job(tmp_path)))
    assert result.exit_code == 0, result.stderr
    (jobset,) = yaml.safe_load_all(result.stdout)
    assert (jobset["kind"], jobset["metadata"]["name"]) == ("JobSet", "mnist")
    assert result.stderr == ""


def test_render_takes_the_runtime_from_another_file_and_adds_the_pod_group(tmp_path):
    runtime = tmp_path / "runtime.yaml"
    runtime.write_text(RUNTIME)
    result = _render("-f", str(_job(tmp_path, runtime="gang")), "-f", str(runtime))
    assert result.exit_code == 0, result.stderr
    assert [d["kind"] for d in yaml.safe_load_all(result.stdout)] == ["JobSet", "PodGroup"]


def test_render_plan_prints_the_backend_neutral_plan(tmp_path):
    result = _render("-f", str(_job(tmp_path)), "--plan")
    assert result.exit_code == 0, result.stderr
    (plan,) = yaml.safe_load_all(result.stdout)
    assert (plan["job_name"], plan["num_nodes"], plan["num_proc_per_node"], plan["ml_policy"]) == (
        "mnist",
        2,
        2,
        "torch",
    )
    assert plan["plugins"] == ["torch", "jobset"]


BAD_INPUT = [
    (
        "malformed_file",
        None,
        "error: {path}: not valid YAML: line 2, column 1: did not find expected node content",
    ),
    (
        "unknown_runtime",
        {"runtime": "torch-distribute"},
        "error: {path}: TrainJob mnist: ClusterTrainingRuntime 'torch-distribute' not found; known "
        "ClusterTrainingRuntimes: deepspeed-distributed, mpi-distributed, ray-distributed, torch-distributed, "
        "torch-distributed-volcano, torchtune-llama3.2-1b, torchtune-llama3.2-3b, torchtune-qwen2.5-1.5b",
    ),
    ("zero_nodes", {"num_nodes": 0}, "error: {path}: spec.trainer.numNodes: must be >= 1, got 0"),
    (
        "bad_num_proc_per_node",
        {"nproc": "abc"},
        "error: {path}: spec.trainer.numProcPerNode: must be auto, cpu, gpu or an integer >= 1, got 'abc'",
    ),
    (
        "reserved_env",
        {"env": "PET_NNODES"},
        "error: {path}: TrainJob mnist: spec.trainer.env[0].name: 'PET_NNODES' is reserved: the torch plugin sets "
        "PET_* variables from numNodes, numProcPerNode and the runtime; set those fields instead",
    ),
]


@pytest.mark.parametrize(("fields", "line"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT])
def test_bad_input_exits_2_with_one_clear_line(tmp_path, fields, line):
    if fields is None:
        path = tmp_path / "job.yaml"
        path.write_text("spec: [\n")
    else:
        path = _job(tmp_path, **fields)
    result = _render("-f", str(path))
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stdout == ""
    assert result.stderr.splitlines() == [line.format(path=path)]


def test_a_missing_file_or_one_without_a_trainjob_exits_2(tmp_path):
    missing = _render("-f", str(tmp_path / "nope.yaml"))
    assert (missing.exit_code, missing.stderr) == (
        2,
        f"error: {tmp_path / 'nope.yaml'}: cannot read: No such file or directory\n",
    )
    runtime = tmp_path / "runtime.yaml"
    runtime.write_text(RUNTIME)
    no_job = _render("-f", str(runtime))
    assert (no_job.exit_code, no_job.stderr) == (2, f"error: {runtime}: no TrainJob found (kind: TrainJob)\n")


def test_render_reads_stdin_for_dash(tmp_path):
    result = CliRunner().invoke(cli, ["render", "-f", "-"], input=_job(tmp_path).read_text())
    assert result.exit_code == 0, result.stderr
    assert next(yaml.safe_load_all(result.stdout))["kind"] == "JobSet"
