"""How plan nodes become processes: CPU and GPU shares, command resolution, environment, notes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from jobtest.local import trainjob_resource

from trainjob.backends.local import launcher
from trainjob.errors import ValidationError
from trainjob.runtime import find_runtime, resolve


@pytest.mark.parametrize(
    ("nodes", "per_node", "available", "expected", "noted"),
    [
        (2, 1, ["0", "1", "2"], [["0"], ["1"]], False),
        (2, 2, ["0", "1", "2", "3"], [["0", "1"], ["2", "3"]], False),
        (2, 2, ["0", "1", "2"], [["0", "1"], ["2"]], True),
        (2, 1, [], [[], []], True),
        (3, 0, ["0"], None, False),
    ],
)
def test_gpus_are_split_disjointly_between_nodes(nodes, per_node, available, expected, noted):
    sets, note = launcher.share_gpus(nodes, per_node, available)
    assert sets == expected
    assert (note is not None) == noted


def test_each_node_gets_its_share_of_the_cores():
    cores = sorted(launcher.os.sched_getaffinity(0))
    sets, note = launcher.share_cpus(len(cores), None)
    assert sets == [[core] for core in cores] and note is None
    sets, note = launcher.share_cpus(2, len(cores))
    assert sets == [cores, cores] and note[0] == "CPUsShared"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["torchrun", "--nnodes", "2", "train.py"], ["PY", "-m", "torch.distributed.run", "--nnodes", "2", "train.py"]),
        (["/usr/bin/torchrun", "train.py"], ["PY", "-m", "torch.distributed.run", "train.py"]),
        (["python", "train.py"], ["PY", "train.py"]),
        (["python3", "-m", "pkg"], ["PY", "-m", "pkg"]),
        (["bash", "-c", "echo $HOME"], ["bash", "-c", "echo $HOME"]),
    ],
)
def test_torchrun_and_python_resolve_to_the_jobs_interpreter(command, expected):
    assert launcher.node_argv(command, "PY") == expected


def test_node_environment_points_rendezvous_at_this_machine(monkeypatch):
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("PET_NNODES", "9")
    node = launcher.NodeLaunch(index=1, command=["x"], env={"PET_NNODES": "2", "PET_RDZV_ENDPOINT": "job-node-0-0.job:29500"})
    env = launcher.node_environment(node, 40123, sys.executable)
    assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"], env["PET_RDZV_ENDPOINT"]) == ("127.0.0.1", "40123", "127.0.0.1:40123")
    assert env["PET_NNODES"] == "2" and "RANK" not in env
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_launch_spec_keeps_the_pod_env_and_adds_the_local_one(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    for name in [n for n in os.environ if n.startswith(launcher.TRAINING_ENV_PREFIXES) and n != "CUDA_VISIBLE_DEVICES"]:
        monkeypatch.delenv(name)  # else an EnvironmentNotInherited note names them
    (tmp_path / "train.py").touch()
    job = trainjob_resource(
        "spec", ["torchrun", "train.py"], args=["--epochs", "3"], num_nodes=2, num_proc_per_node=2,
        env=[{"name": "NCCL_DEBUG", "value": "INFO"}], resources_per_node={"requests": {"nvidia.com/gpu": "2"}},
    )
    plan = resolve(job, find_runtime("torch-distributed"))
    spec = launcher.build_launch_spec(plan, tmp_path, str(tmp_path))

    assert [node.command for node in spec.nodes] == [["torchrun", "train.py", "--epochs", "3"]] * 2
    for index, node in enumerate(spec.nodes):
        assert node.env["PET_NODE_RANK"] == str(index)
        assert node.env["NCCL_DEBUG"] == "INFO" and node.env["PET_NPROC_PER_NODE"] == "2"
        assert node.env["TRAINJOB_METRICS_FILE"] == str(tmp_path / "metrics.jsonl")
    assert [n.env["CUDA_VISIBLE_DEVICES"] for n in spec.nodes] == ["0,1", "2,3"]
    assert [reason for reason, _ in spec.notes] == ["ImageNotUsed"]
    assert launcher.LaunchSpec.from_dict(spec.to_dict()) == spec


def test_a_trainer_without_command_is_refused(tmp_path):
    plan = resolve(trainjob_resource("nocmd", []), find_runtime("torch-distributed"))
    with pytest.raises(ValidationError, match="spec.trainer.command"):
        launcher.build_launch_spec(plan, tmp_path, "/work")
