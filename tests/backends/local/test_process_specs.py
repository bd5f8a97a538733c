"""How plan nodes become processes: CPU and GPU shares, command resolution, environment, notes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from jobtest.local import trainjob_resource

from trainjob.api import ClusterTrainingRuntime
from trainjob.backends.local import process_specs
from trainjob.errors import ValidationError
from trainjob.runtime import find_runtime, resolve
from trainjob.runtime.launch import resolve_launch_values, torchrun_env


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
    sets, note = process_specs.share_gpus(nodes, per_node, available)
    assert sets == expected
    assert (note is not None) == noted


def test_each_node_gets_its_share_of_the_cores():
    cores = sorted(process_specs.os.sched_getaffinity(0))
    sets, note = process_specs.share_cpus(len(cores), None)
    assert sets == [[core] for core in cores] and note is None
    sets, note = process_specs.share_cpus(2, len(cores))
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
    assert process_specs.node_argv(command, "PY") == expected


def test_node_environment_points_rendezvous_at_this_machine(monkeypatch):
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("PET_NNODES", "9")
    node = process_specs.NodeProcessSpec(index=1, command=["x"], env={"PET_NNODES": "2", "PET_RDZV_ENDPOINT": "job-node-0-0.job:29500"})
    env = process_specs.node_environment(node, 40123, sys.executable)
    assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"], env["PET_RDZV_ENDPOINT"]) == ("127.0.0.1", "40123", "127.0.0.1:40123")
    assert env["PET_NNODES"] == "2" and "RANK" not in env
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_launch_spec_keeps_the_pod_env_and_adds_the_local_one(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    for name in [n for n in os.environ if n.startswith(process_specs.TRAINING_ENV_PREFIXES) and n != "CUDA_VISIBLE_DEVICES"]:
        monkeypatch.delenv(name)  # else an EnvironmentNotInherited note names them
    (tmp_path / "train.py").touch()
    job = trainjob_resource(
        "spec", ["torchrun", "train.py"], args=["--epochs", "3"], num_nodes=2, num_proc_per_node=2,
        env=[{"name": "NCCL_DEBUG", "value": "INFO"}], resources_per_node={"requests": {"nvidia.com/gpu": "2"}},
    )
    plan = resolve(job, find_runtime("torch-distributed"))
    spec = process_specs.build_process_spec(plan, tmp_path, str(tmp_path))

    assert [node.command for node in spec.nodes] == [["torchrun", "train.py", "--epochs", "3"]] * 2
    for index, node in enumerate(spec.nodes):
        assert node.env["PET_NODE_RANK"] == str(index)
        assert node.env["NCCL_DEBUG"] == "INFO" and node.env["PET_NPROC_PER_NODE"] == "2"
        assert node.env["TRAINJOB_METRICS_FILE"] == str(tmp_path / "metrics.jsonl")
    assert [n.env["CUDA_VISIBLE_DEVICES"] for n in spec.nodes] == ["0,1", "2,3"]
    assert [reason for reason, _ in spec.notes] == ["ImageNotUsed"]
    assert process_specs.ProcessSpec.from_dict(spec.to_dict()) == spec


def test_a_trainer_without_command_is_refused(tmp_path):
    plan = resolve(trainjob_resource("nocmd", []), find_runtime("torch-distributed"))
    with pytest.raises(ValidationError, match="spec.trainer.command"):
        process_specs.build_process_spec(plan, tmp_path, "/work")


def _elastic_runtime(min_nodes: int, max_nodes: int) -> ClusterTrainingRuntime:
    runtime = find_runtime("torch-distributed").to_dict()
    runtime["metadata"]["name"] = "elastic"
    runtime["spec"]["mlPolicy"] = {
        "torch": {"numProcPerNode": 2, "elasticPolicy": {"minNodes": min_nodes, "maxNodes": max_nodes, "maxRestarts": 3}}
    }
    return ClusterTrainingRuntime.from_dict(runtime)


@pytest.mark.parametrize(
    ("kind", "restarts", "expected_max_restarts"),
    [("static", 0, None), ("elastic", 1, "0"), ("shrinkable", 2, "3")],
)
def test_a_torch_nodes_pet_env_is_the_launch_contract_with_this_machines_addressing(
    tmp_path, kind, restarts, expected_max_restarts
):
    if kind == "static":
        plan = resolve(trainjob_resource("tj", ["torchrun", "t.py"], num_nodes=2, num_proc_per_node=2),
                       find_runtime("torch-distributed"))
    else:
        job = trainjob_resource("tj", ["torchrun", "t.py"], runtime="elastic")
        plan = resolve(job, _elastic_runtime(2 if kind == "shrinkable" else 3, 3))
    spec = process_specs.build_process_spec(plan, tmp_path, str(tmp_path))
    assert spec.shrinkable == (kind == "shrinkable")
    rendezvous_port = 4321 if spec.shrinkable else None
    for node in spec.nodes:
        env = process_specs.node_environment(node, 40123, sys.executable, restarts=restarts, elastic=spec.elastic,
                                        rendezvous_port=rendezvous_port, max_restarts=spec.max_restarts)
        addressing = process_specs.local_addressing(node, 40123, restarts, rendezvous_port)
        contract = {var.name: var.value for var in torchrun_env(resolve_launch_values(plan), addressing)}
        if expected_max_restarts is not None:  # the supervisor, not torchrun, restarts a group that cannot shrink
            contract["PET_MAX_RESTARTS"] = expected_max_restarts
        assert {name: env[name] for name in contract} == contract
        assert (env["PET_NODE_RANK"], env["PET_MASTER_ADDR"]) == (str(node.index), "127.0.0.1")
        if spec.shrinkable:
            assert (env["PET_RDZV_ENDPOINT"], env["PET_RDZV_ID"]) == ("127.0.0.1:4321", f"tj-{restarts}")
