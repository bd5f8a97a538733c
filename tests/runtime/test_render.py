"""Rendering: JobSets and PodGroups compared with golden files and checked against the JobSet CRD and
Kubernetes' own schemas. Inputs are tests/runtime/cases/*.yaml and the seeds' manifests."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainjob.api import TrainJob, dump_yaml, load_resources
from trainjob.runtime import find_runtime, resolve
from trainjob.runtime.render import render_jobset, render_objects

HERE = Path(__file__).resolve().parent
CASES = sorted((HERE / "cases").glob("*.yaml"))
SEED_COPIES = sorted((HERE.parent / "api" / "seed_manifests").glob("*.yaml"))


def _rendered(paths: list[Path]) -> dict[str, list[dict]]:
    """``{job name: rendered objects}`` for every TrainJob in ``paths``, with the runtimes found there."""
    resources = [r for path in paths for r in load_resources(path)]
    runtimes = [r for r in resources if not isinstance(r, TrainJob)]
    return {
        job.name: render_objects(
            resolve(job, find_runtime(job.spec.runtime_ref, runtimes, namespace=job.namespace))
        )
        for job in resources
        if isinstance(job, TrainJob)
    }


def _all_rendered() -> dict[str, list[dict]]:
    out = {f"seed-{name}": objects for name, objects in _rendered(SEED_COPIES).items()}
    for case in CASES:
        out.update({f"{case.stem}": objects for objects in _rendered([case]).values()})
    return out


RENDERED = _all_rendered()


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_rendered_objects_match_the_golden_file(name, golden):
    golden(name, dump_yaml(RENDERED[name]))


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_rendered_jobset_fits_the_jobset_crd(name, jobset_errors):
    jobset = RENDERED[name][0]
    assert jobset["kind"] == "JobSet" and jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert jobset_errors(jobset) == []


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_every_rendered_job_fits_the_kubernetes_schema(name, kubernetes_job_errors):
    for replicated in RENDERED[name][0]["spec"]["replicatedJobs"]:
        assert kubernetes_job_errors(replicated, f"{name}-{replicated['name']}") == []


def test_the_schema_checks_catch_a_misspelled_field(jobset_errors, kubernetes_job_errors):
    jobset = RENDERED["builtin-minimal"][0]
    broken = {**jobset, "spec": {**jobset["spec"], "replicatedJob": []}}
    assert jobset_errors(broken) == [
        "spec: Additional properties are not allowed ('replicatedJob' was unexpected)"
    ]
    node = jobset["spec"]["replicatedJobs"][0]
    container = node["template"]["spec"]["template"]["spec"]["containers"][0]
    bad_node = {
        "template": {
            "spec": {
                **node["template"]["spec"],
                "template": {"spec": {"containers": [{**container, "imagePullPolice": "Always"}]}},
            }
        }
    }
    assert kubernetes_job_errors(bad_node, "x") != []


def test_the_jobset_makes_the_master_address_resolvable_and_ranks_indexed(make_job):
    from trainjob.runtime import builtin_runtimes

    plan = resolve(make_job(numNodes=3), builtin_runtimes()["torch-distributed"])
    jobset = render_jobset(plan)
    node = jobset["spec"]["replicatedJobs"][0]
    # JobSet names pods {jobset}-{replicatedJob}-{jobIndex}-{podIndex} in the subdomain: the first one is the master.
    pod_host = f"{jobset['metadata']['name']}-{node['name']}-0-0.{jobset['spec']['network']['subdomain']}"
    assert pod_host == plan.master_addr() == "mnist-node-0-0.mnist"
    assert jobset["spec"]["network"]["enableDNSHostnames"] is True
    job_spec = node["template"]["spec"]
    assert (
        node["replicas"],
        job_spec["completionMode"],
        job_spec["parallelism"],
        job_spec["completions"],
    ) == (
        1,
        "Indexed",
        3,
        3,
    )
    pod = job_spec["template"]
    assert pod["metadata"]["labels"]["trainer.kubeflow.org/trainjob-name"] == "mnist"
    assert jobset["metadata"]["labels"]["trainer.kubeflow.org/trainjob-name"] == "mnist"


def test_the_trainjob_settings_land_on_the_node_container(make_job):
    from trainjob.runtime import builtin_runtimes

    job = make_job(
        image="me/train:1",
        command=["torchrun"],
        args=["t.py"],
        env=[{"name": "A", "value": "1"}],
        resourcesPerNode={"limits": {"cpu": "3"}},
    )
    container = render_jobset(resolve(job, builtin_runtimes()["torch-distributed"]))["spec"][
        "replicatedJobs"
    ][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "node"
    assert (container["image"], container["command"], container["args"]) == (
        "me/train:1",
        ["torchrun"],
        ["t.py"],
    )
    assert container["env"][0] == {"name": "A", "value": "1"}
    assert container["resources"] == {"limits": {"cpu": "3"}}
