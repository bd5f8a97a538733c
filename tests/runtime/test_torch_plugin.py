"""The torch plugin: PET_* env, node count, port 29500, elastic training and what it rejects."""

from __future__ import annotations

import pytest

from trainjob.errors import ValidationError
from trainjob.runtime import builtin_runtimes, resolve
from trainjob.runtime.plan import COMPLETION_INDEX_FIELD_PATH

RANK = {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD_PATH}}
ELASTIC = {"torch": {"numProcPerNode": 2, "elasticPolicy": {"minNodes": 2, "maxNodes": 4, "maxRestarts": 3}}}


def _env(plan):
    return {
        var.name: var.value if var.value_from is None else var.value_from
        for var in plan.trainer().container().env
    }


def test_static_job_gets_exactly_the_five_torchrun_variables(make_job):
    plan = resolve(make_job(numNodes=3, numProcPerNode=2), builtin_runtimes()["torch-distributed"])
    assert _env(plan) == {
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": RANK,
        "PET_MASTER_ADDR": "mnist-node-0-0.mnist",
        "PET_MASTER_PORT": "29500",
    }
    assert plan.elastic is None and plan.ml_policy == "torch"


@pytest.mark.parametrize(
    ("job_nodes", "runtime_nodes", "expected"),
    [(4, 2, 4), (None, 2, 2), (None, None, 1)],
    ids=["trainjob_wins", "runtime_default", "one_when_unset"],
)
def test_pet_nnodes_comes_from_trainjob_then_runtime_then_one(
    make_job, make_runtime, job_nodes, runtime_nodes, expected
):
    policy = {"torch": {}} | ({"numNodes": runtime_nodes} if runtime_nodes else {})
    trainer = {"numNodes": job_nodes} if job_nodes else {}
    plan = resolve(make_job(runtime="rt", **trainer), make_runtime(mlPolicy=policy))
    assert _env(plan)["PET_NNODES"] == str(expected)
    assert plan.num_nodes == plan.trainer().count == expected


def test_node_rank_resolves_to_each_pods_completion_index(make_job):
    plan = resolve(make_job(numNodes=3), builtin_runtimes()["torch-distributed"])
    container = plan.trainer().container()
    assert [container.env_dict(index=i)["PET_NODE_RANK"] for i in range(3)] == ["0", "1", "2"]
    assert "PET_NODE_RANK" not in container.env_dict()


def test_master_port_is_opened_once_on_the_trainer_container(make_job, make_runtime):
    runtime = make_runtime(mlPolicy={"torch": {}}, container={"ports": [{"containerPort": 29500}]})
    ports = resolve(make_job(runtime="rt"), runtime).trainer().container().ports
    assert [p.container_port for p in ports] == [29500]
    ports = resolve(make_job(), builtin_runtimes()["torch-distributed"]).trainer().container().ports
    assert [(p.container_port, p.protocol) for p in ports] == [(29500, "TCP")]


def test_trainjob_env_is_merged_by_name_over_the_runtime_env_before_the_pet_variables(make_job, make_runtime):
    runtime = make_runtime(
        mlPolicy={"torch": {}},
        container={"env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "A", "value": "1"}]},
    )
    plan = resolve(make_job(runtime="rt", env=[{"name": "NCCL_DEBUG", "value": "INFO"}]), runtime)
    names = [v.name for v in plan.trainer().container().env]
    assert names[:2] == ["NCCL_DEBUG", "A"] and names[2].startswith("PET_")
    assert _env(plan)["NCCL_DEBUG"] == "INFO"


def test_elastic_policy_gives_a_node_range_and_c10d_rendezvous(make_job, make_runtime):
    plan = resolve(make_job(runtime="rt"), make_runtime(mlPolicy=ELASTIC))
    assert _env(plan) == {
        "PET_NNODES": "2:4",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": RANK,
        "PET_MASTER_ADDR": "mnist-node-0-0.mnist",
        "PET_MASTER_PORT": "29500",
        "PET_MAX_RESTARTS": "3",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": "mnist-node-0-0.mnist:29500",
        "PET_RDZV_ID": "mnist",
        "PET_RDZV_CONF": "last_call_timeout=5",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    assert (plan.elastic.min_nodes, plan.elastic.max_nodes, plan.elastic.max_restarts) == (2, 4, 3)
    assert plan.trainer().count == plan.num_nodes == 4


@pytest.mark.parametrize(
    ("elastic", "nnodes", "restarts"),
    [({"maxNodes": 3}, "1:3", "0"), ({"minNodes": 3, "maxNodes": 3, "maxRestarts": 1}, "3:3", "1")],
    ids=["min_defaults_to_one_restarts_to_zero", "fixed_range"],
)
def test_elastic_defaults(make_job, make_runtime, elastic, nnodes, restarts):
    plan = resolve(make_job(runtime="rt"), make_runtime(mlPolicy={"torch": {"elasticPolicy": elastic}}))
    assert (_env(plan)["PET_NNODES"], _env(plan)["PET_MAX_RESTARTS"]) == (nnodes, restarts)


REJECTED = [
    (
        {"env": [{"name": "PET_NNODES", "value": "8"}]},
        None,
        "spec.trainer.env[0].name: 'PET_NNODES' is reserved: the torch plugin sets PET_* variables from numNodes, "
        "numProcPerNode and the runtime; set those fields instead",
    ),
    (
        {
            "spec": {
                "podTemplateOverrides": [
                    {
                        "targetJobs": [{"name": "node"}],
                        "spec": {
                            "containers": [
                                {"name": "node", "env": [{"name": "PET_MASTER_PORT", "value": "1"}]}
                            ]
                        },
                    }
                ]
            }
        },
        None,
        "spec.podTemplateOverrides[0].spec.containers[0].env[0].name: 'PET_MASTER_PORT' is reserved: the torch "
        "plugin sets PET_* variables from numNodes, numProcPerNode and the runtime; set those fields instead",
    ),
    (
        {"numNodes": 2},
        ELASTIC,
        "spec.trainer.numNodes: must not be set: runtime 'rt' is elastic (mlPolicy.torch.elasticPolicy decides the "
        "node count between minNodes and maxNodes)",
    ),
]


@pytest.mark.parametrize(
    ("job_fields", "policy", "message"), REJECTED, ids=["pet_env", "pet_env_override", "numnodes_elastic"]
)
def test_rejected_jobs_name_the_field(make_job, make_runtime, job_fields, policy, message):
    with pytest.raises(ValidationError) as err:
        resolve(make_job(runtime="rt", **job_fields), make_runtime(mlPolicy=policy or {"torch": {}}))
    assert str(err.value) == message


def test_several_problems_are_reported_together(make_job, make_runtime):
    job = make_job(runtime="rt", numNodes=2, env=[{"name": "PET_RDZV_ID", "value": "x"}])
    with pytest.raises(ValidationError) as err:
        resolve(job, make_runtime(mlPolicy=ELASTIC))
    assert [e.path for e in err.value.errors] == ["spec.trainer.env[0].name", "spec.trainer.numNodes"]
