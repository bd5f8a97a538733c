"""A job bigger than this machine is laid out over the whole machine, and says how; strict resources refuse it."""

from __future__ import annotations

import pytest
from jobtest.local import trainjob_resource

from trainjob.backends.local.client.scaling import scale_to_machine, strict_resources
from trainjob.backends.local.process_specs import NodeProcessSpec, ProcessSpec
from trainjob.backends.local.queue import Machine, Request, check_fits
from trainjob.errors import ValidationError

GI = 2**30


def spec_of(nodes: int, gpus: str | None = None) -> ProcessSpec:
    """What the process spec of an ``nodes``-node job looks like before scaling (OMP and GPUs as submit set them)."""
    env = {"OMP_NUM_THREADS": "7", **({"CUDA_VISIBLE_DEVICES": gpus} if gpus is not None else {})}
    return ProcessSpec(
        nodes=[NodeProcessSpec(i, ["torchrun", "train.py"], dict(env), cpus=[0, 1]) for i in range(nodes)],
        cwd="/",
        notes=[("CPUsShared", "nodes share cores"), ("GPUsUnavailable", "no GPUs"), ("ImageNotUsed", "image")],
    )


@pytest.mark.parametrize(
    ("machine", "request_", "procs", "cpus", "omp", "gpus", "summary"),
    [
        # the seeds' example on a 2-core laptop without GPUs: 4 nodes share the 2 cores, the ranks see no GPU
        (Machine((0, 1), 16 * GI, ()), Request(4, 8, 32 * GI, 2), 2,
         [[0], [1], [0], [1]], "1", ["", "", "", ""],
         "32 CPUs asked, the 4 node(s) share 2 core(s); 8 GPUs asked, there are 0: the ranks see none; "
         "128Gi of memory asked, there is 16Gi: not enforced"),
        # 16 cores for 2 nodes asking 32 each: 8 cores each, disjoint, OMP = 8 cores / 2 processes
        (Machine(tuple(range(16)), 64 * GI, ()), Request(2, 32), 2,
         [list(range(8)), list(range(8, 16))], "4", None, "64 CPUs asked, the 2 node(s) divide 16 core(s)"),
        # 4 GPUs for 2 nodes asking 4 each (2 processes each): 2 each, so each process has its own
        (Machine(tuple(range(16)), 64 * GI, ("0", "1", "2", "3")), Request(2, 1, 0, 4), 2,
         None, None, ["0,1", "2,3"], "8 GPUs asked, there are 4: 2 per node"),
        # 1 GPU for 1 node running 2 processes on 2 GPUs: they would share it (NCCL refuses), so none
        (Machine((0, 1), 16 * GI, ("0",)), Request(1, 1, 0, 2), 2,
         None, None, [""], "2 GPUs asked, there are 1: the ranks see none"),
        # ... but 1 process on 2 GPUs gets the one there is, and 4 processes sharing 2 GPUs by design share 1
        (Machine((0, 1), 16 * GI, ("0",)), Request(1, 1, 0, 2), 1,
         None, None, ["0"], "2 GPUs asked, there are 1: 1 per node"),
        (Machine((0, 1), 16 * GI, ("0",)), Request(1, 1, 0, 2), 4,
         None, None, ["0"], "2 GPUs asked, there are 1: 1 per node"),
    ],
)
def test_what_the_machine_lacks_is_scaled_and_what_fits_is_left_as_asked(machine, request_, procs, cpus, omp, gpus,
                                                                         summary):
    spec = spec_of(request_.nodes, gpus="9" if request_.gpus_per_node else None)

    scaling = scale_to_machine(spec, request_, machine, processes_per_node=procs, job_sets_omp=False)

    assert scaling.summary == summary
    assert [node.cpus for node in spec.nodes] == (cpus or [[0, 1]] * request_.nodes)
    assert {node.env["OMP_NUM_THREADS"] for node in spec.nodes} == {omp or "7"}
    assert [node.env.get("CUDA_VISIBLE_DEVICES") for node in spec.nodes] == (gpus or [None] * request_.nodes)
    assert [reason for reason, _ in spec.notes] == ["ImageNotUsed"]  # the event says it better
    assert "runs alone" in scaling.detail and "TRAINJOB_STRICT_RESOURCES=1" in scaling.detail


def test_the_event_names_each_nodes_cores_and_a_jobs_own_omp_setting_is_kept():
    spec = spec_of(4)

    scaling = scale_to_machine(spec, Request(4, 8), Machine((0, 1), 16 * GI, ()), processes_per_node=2,
                               job_sets_omp=True)

    assert {node.env["OMP_NUM_THREADS"] for node in spec.nodes} == {"7"}
    assert ("CPU: 4 node(s) x 8 = 32 asked, this machine has 2: each node gets 1 core(s) (node-0: 0, node-1: 1, "
            "node-2: 0, node-3: 1), shared between nodes, OMP_NUM_THREADS as the job sets it") in scaling.detail


def job(annotations=None):
    resource = trainjob_resource("j", ["python", "x.py"])
    resource.metadata.annotations = annotations
    return resource


@pytest.mark.parametrize(
    ("annotations", "configured", "env", "config", "strict"),
    [
        (None, None, None, None, None),
        (None, None, "1", None, "TRAINJOB_STRICT_RESOURCES=1"),
        (None, None, None, "strict_resources: true\n", "strict_resources: true in"),
        (None, True, "0", None, "LocalProcessBackendConfig(strict_resources=True)"),  # the backend's over the env
        (None, False, "1", None, None),
        ({"trainjob/strict-resources": "true"}, False, None, None, 'annotation trainjob/strict-resources: "true"'),
        ({"trainjob/strict-resources": "false"}, None, "1", None, None),  # the job's own word wins
    ],
)
def test_strict_resources_come_from_the_job_the_backend_the_environment_then_the_config_file(
        settings, annotations, configured, env, config, strict):
    settings("TRAINJOB_STRICT_RESOURCES", env, config)

    found = strict_resources(job(annotations), configured)

    if strict is None:
        assert found is None
    else:
        assert found.startswith(strict)


@pytest.mark.parametrize(
    ("annotations", "env", "message"),
    [
        ({"trainjob/strict-resources": "maybe"}, None,
         r"metadata.annotations\[trainjob/strict-resources\]: must be true or false .*got 'maybe'"),
        (None, "sometimes", "TRAINJOB_STRICT_RESOURCES: must be true or false .*got 'sometimes'"),
    ],
)
def test_a_strict_setting_that_is_not_a_boolean_is_refused(monkeypatch, annotations, env, message):
    if env is not None:
        monkeypatch.setenv("TRAINJOB_STRICT_RESOURCES", env)
    with pytest.raises(ValidationError, match=message):
        strict_resources(job(annotations))


def test_the_strict_refusal_keeps_the_numbers_and_says_why_it_was_not_scaled():
    with pytest.raises(ValidationError) as caught:
        check_fits(Request(4, 8, 0, 2), Machine((0, 1), 16 * GI, ()), why="strict resources are on (X=1)")
    assert str(caught.value) == (
        "spec.trainer.resourcesPerNode: the job could never run on this machine: 4 node(s) x 8 CPU(s) = 32 CPUs, "
        "this machine has 2; 4 node(s) x 2 GPU(s) = 8 GPUs, this machine has 0 (request less, or set "
        "TRAINJOB_OVERSUBSCRIBE=1 to run it anyway with nodes sharing what there is); strict resources are on (X=1)"
    )
