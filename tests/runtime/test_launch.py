"""LaunchValues: the launch values a resolved job runs with, their JSON form and the rank -> node mapping."""

from __future__ import annotations

import json

import pytest

from trainjob.constants import COMPLETION_INDEX_FIELD_PATH, MASTER_PORT
from trainjob.runtime import builtin_runtimes, resolve
from trainjob.runtime.launch import (
    COMPLETION_INDEX,
    Addressing,
    LaunchValues,
    addressing_env,
    kubernetes_addressing,
    resolve_launch_values,
    torchrun_env,
)

ELASTIC = {"torch": {"numProcPerNode": 2, "elasticPolicy": {"minNodes": 2, "maxNodes": 4, "maxRestarts": 3}}}


def test_static_plan_json_has_exactly_nodes_processes_and_port():
    plan = LaunchValues(num_nodes=2, num_proc_per_node=4)
    assert plan.to_dict() == {"numNodes": 2, "numProcPerNode": 4, "masterPort": MASTER_PORT}
    assert not plan.elastic and plan.nnodes_arg() == "2"


def test_elastic_plan_json_adds_the_node_range_and_restarts():
    plan = LaunchValues(num_nodes=4, num_proc_per_node=2, min_nodes=2, max_nodes=4, max_restarts=3)
    assert plan.elastic and plan.nnodes_arg() == "2:4"
    assert plan.to_dict()["elastic"] == {"minNodes": 2, "maxNodes": 4, "maxRestarts": 3}


@pytest.mark.parametrize(
    "plan",
    [
        LaunchValues(num_nodes=1, num_proc_per_node=1),
        LaunchValues(num_nodes=3, num_proc_per_node=8, master_port=30000),
        LaunchValues(num_nodes=4, num_proc_per_node=2, min_nodes=1, max_nodes=4, max_restarts=5),
    ],
)
def test_json_round_trip(plan):
    assert LaunchValues.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_from_dict_without_port_uses_the_default_port():
    assert LaunchValues.from_dict({"numNodes": 2, "numProcPerNode": 1}).master_port == MASTER_PORT


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"numProcPerNode": 1}, "numNodes"),
        ({"numNodes": 1}, "numProcPerNode"),
        ({"numNodes": 0, "numProcPerNode": 1}, "numNodes"),
        ({"numNodes": 1, "numProcPerNode": "auto"}, "numProcPerNode"),
        ({"numNodes": 1, "numProcPerNode": 1, "masterPort": 70000}, "masterPort"),
        ({"numNodes": 4, "numProcPerNode": 1, "elastic": {"maxNodes": 4}}, "minNodes"),
        ({"numNodes": 4, "numProcPerNode": 1, "elastic": {"minNodes": 5, "maxNodes": 4}}, "minNodes"),
        ({"numNodes": 4, "numProcPerNode": 1, "elastic": {"minNodes": 1, "maxNodes": 4, "maxRestarts": -1}},
         "maxRestarts"),
        ({"numNodes": 4, "numProcPerNode": 1, "elastic": 3}, "elastic"),
    ],
)
def test_from_dict_names_the_missing_or_bad_key(data, named):
    with pytest.raises(ValueError, match=named):
        LaunchValues.from_dict(data)


def test_node_of_rank_divides_by_processes_per_node():
    plan = LaunchValues(num_nodes=2, num_proc_per_node=4)
    assert [plan.node_of_rank(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("rank", [-1, 8, 100])
def test_node_of_rank_out_of_range_names_the_valid_range(rank):
    with pytest.raises(ValueError, match=r"0\.\.7"):
        LaunchValues(num_nodes=2, num_proc_per_node=4).node_of_rank(rank)


def test_launch_plan_of_a_torch_job_with_auto_processes_has_the_resolved_count(make_job):
    job = make_job(numNodes=2, numProcPerNode="auto", resourcesPerNode={"limits": {"nvidia.com/gpu": "4"}})
    launch = resolve_launch_values(resolve(job, builtin_runtimes()["torch-distributed"]))
    assert launch == LaunchValues(num_nodes=2, num_proc_per_node=4)
    assert launch.node_of_rank(3) == 0 and launch.node_of_rank(4) == 1


def test_launch_plan_of_an_elastic_torch_job(make_job, make_runtime):
    launch = resolve_launch_values(resolve(make_job(runtime="rt"), make_runtime(mlPolicy=ELASTIC)))
    assert launch == LaunchValues(num_nodes=4, num_proc_per_node=2, min_nodes=2, max_nodes=4, max_restarts=3)


def test_launch_plan_of_a_plainml_job_runs_one_process_per_node(make_job, make_runtime):
    launch = resolve_launch_values(resolve(make_job(runtime="rt", numNodes=3), make_runtime()))
    assert launch.to_dict() == {"numNodes": 3, "numProcPerNode": 1, "masterPort": MASTER_PORT}


def test_launch_plan_of_an_mpi_job_counts_hosts_and_slots(make_job):
    job = make_job(runtime="mpi-distributed", numNodes=3, numProcPerNode=2)
    plan = resolve(job, builtin_runtimes()["mpi-distributed"])
    launch = resolve_launch_values(plan)
    assert (launch.num_nodes, launch.num_proc_per_node) == (len(plan.mpi.hosts), 2)


def _env(variables):
    return {var.name: var.value if var.value_from is None else var.value_from for var in variables}


def test_torchrun_env_of_a_static_job_with_a_literal_rank():
    env = _env(torchrun_env(LaunchValues(2, 4), Addressing("127.0.0.1", node_rank=1, master_port=40123)))
    assert env == {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "4",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "40123",
    }


def test_torchrun_env_of_an_elastic_job_takes_the_rendezvous_the_addressing_overrides():
    launch = LaunchValues(3, 1, min_nodes=2, max_nodes=3, max_restarts=4)
    default = _env(torchrun_env(launch, Addressing("m", node_rank=COMPLETION_INDEX, rdzv_id="job")))
    assert default["PET_NODE_RANK"] == {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD_PATH}}
    assert (default["PET_NNODES"], default["PET_MAX_RESTARTS"]) == ("2:3", "4")
    assert (default["PET_RDZV_ENDPOINT"], default["PET_RDZV_ID"], default["PET_RDZV_CONF"]) == (
        f"m:{MASTER_PORT}", "job", "last_call_timeout=5"
    )
    moved = _env(torchrun_env(launch, Addressing("m", rdzv_endpoint="s:1", rdzv_id="job-2", rdzv_conf="c=1")))
    assert "PET_NODE_RANK" not in moved
    assert (moved["PET_RDZV_ENDPOINT"], moved["PET_RDZV_ID"], moved["PET_RDZV_CONF"]) == ("s:1", "job-2", "c=1")


def test_an_elastic_job_needs_a_rendezvous_id():
    with pytest.raises(ValueError, match="rdzv_id"):
        addressing_env(Addressing("m"), rendezvous=True)


@pytest.mark.parametrize("elastic", [False, True])
def test_the_torch_plugin_env_is_the_contract_with_kubernetes_addressing(make_job, make_runtime, elastic):
    runtime = make_runtime(mlPolicy=ELASTIC if elastic else {"torch": {"numProcPerNode": 2}})
    plan = resolve(make_job(runtime="rt", **({} if elastic else {"numNodes": 2})), runtime)
    addressing = kubernetes_addressing(plan)
    assert (addressing.master_addr, addressing.node_rank) == ("mnist-node-0-0.mnist", COMPLETION_INDEX)
    names = {var.name for var in torchrun_env(resolve_launch_values(plan), addressing)}
    pet = [var for var in plan.trainer().container().env if var.name in names]
    assert pet == torchrun_env(resolve_launch_values(plan), addressing)
