"""Both Kubeflow Trainer API generations load, validate and plan: the seeds' v2.1 shape (``numProcPerNode:
auto|cpu|gpu`` on the runtime, ``elasticPolicy``, ``podTemplateOverrides``, ``spec.labels``) and today's v2.2/v2.3
shape (``torch: {}``, ``trainer.numProcPerNode`` an integer, ``runtimePatches``, ``activeDeadlineSeconds``,
``envInjection``, ``status.trainerStatus``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from trainjob.api import ClusterTrainingRuntime, TrainJob
from trainjob.errors import ValidationError
from trainjob.runtime import resolve
from trainjob.runtime.render import render_jobset


def runtime_v23(**torch: Any) -> ClusterTrainingRuntime:
    """Kubeflow Trainer v2.3's torch-distributed runtime: ``torch: {}``, plus a sidecar for envInjection."""
    return ClusterTrainingRuntime.from_dict({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-v23", "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": torch},
            "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                "spec": {"template": {"spec": {"containers": [
                    {"name": "node", "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"},
                    {"name": "metrics", "image": "busybox"},
                ]}}},
            }}]}},
        },
    })


def runtime_v21() -> ClusterTrainingRuntime:
    data = runtime_v23().to_dict()
    data["metadata"]["name"] = "torch-v21"
    data["spec"]["mlPolicy"]["torch"] = {"numProcPerNode": "cpu"}
    return ClusterTrainingRuntime.from_dict(data)


def job(runtime: str, **spec: Any) -> TrainJob:
    return TrainJob.from_dict({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "gen"},
        "spec": {"runtimeRef": {"name": runtime}, **spec},
    })


TRAINER = {"numNodes": 2, "resourcesPerNode": {"requests": {"cpu": "2"}}, "command": ["torchrun", "train.py"]}
POD_CHANGES = {"nodeSelector": {"pool": "a100"}, "containers": [{"name": "node", "env": [{"name": "MODE", "value": "fast"}]}]}

V21 = {
    "trainer": TRAINER,
    "labels": {"team": "cv"},
    "podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "metadata": {"labels": {"tier": "gold"}},
                              "spec": POD_CHANGES}],
}
V23 = {
    "trainer": {**TRAINER, "numProcPerNode": 2},
    "activeDeadlineSeconds": 3600,
    "runtimePatches": [{"manager": "trainer.kubeflow.org/kubeflow-sdk", "trainingRuntimeSpec": {"template": {
        "metadata": {"labels": {"team": "cv"}},
        "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
            "metadata": {"labels": {"tier": "gold"}}, "spec": POD_CHANGES}}}}]},
    }}}],
}


def pod_template(jobset: dict[str, Any]) -> dict[str, Any]:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def test_a_v21_job_and_its_v23_translation_plan_the_same_pods():
    old = resolve(job("torch-v21", **V21), runtime_v21())
    new = resolve(job("torch-v23", **V23), runtime_v23())

    assert (old.num_nodes, old.num_proc_per_node) == (new.num_nodes, new.num_proc_per_node) == (2, 2)
    old_js, new_js = render_jobset(old), render_jobset(new)
    assert old_js["metadata"]["labels"]["team"] == new_js["metadata"]["labels"]["team"] == "cv"
    for rendered in (old_js, new_js):
        pod = pod_template(rendered)
        node = next(c for c in pod["spec"]["containers"] if c["name"] == "node")
        assert pod["metadata"]["labels"]["tier"] == "gold"
        assert pod["spec"]["nodeSelector"] == {"pool": "a100"}
        assert {"name": "MODE", "value": "fast"} in node["env"]
    assert new_js["spec"]["replicatedJobs"][0]["template"]["spec"]["activeDeadlineSeconds"] == 3600


def test_runtime_patches_set_what_only_v22_can_say():
    spec = copy.deepcopy(V23)
    pod = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    pod["metadata"] = {"annotations": {"job-level": "yes"}}
    pod["spec"]["template"]["spec"] = {"securityContext": {"runAsNonRoot": True}, "terminationGracePeriodSeconds": 5,
                                       "containers": [{"name": "node", "securityContext": {"runAsUser": 1000}}]}
    spec["runtimePatches"].append({"manager": "kueue.x-k8s.io/manager", "trainingRuntimeSpec": {"template": {
        "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
            "nodeSelector": {"zone": "b"}}}}}}]}}}})

    rendered = render_jobset(resolve(job("torch-v23", **spec), runtime_v23()))

    replicated = rendered["spec"]["replicatedJobs"][0]["template"]
    pod_spec = replicated["spec"]["template"]["spec"]
    assert replicated["metadata"]["annotations"]["job-level"] == "yes"
    assert (pod_spec["securityContext"], pod_spec["terminationGracePeriodSeconds"]) == ({"runAsNonRoot": True}, 5)
    assert next(c for c in pod_spec["containers"] if c["name"] == "node")["securityContext"] == {"runAsUser": 1000}
    assert pod_spec["nodeSelector"] == {"zone": "b"}, "every manager's patch applies, in order"


def test_env_injection_gives_the_named_sidecar_the_torchrun_env():
    plan = resolve(job("torch-v23", trainer=TRAINER), runtime_v23(envInjection={"targets": [
        {"jobName": "node", "containerNames": ["metrics"]}]}))

    sidecar = next(c for c in pod_template(render_jobset(plan))["spec"]["containers"] if c["name"] == "metrics")
    assert {"name": "PET_NNODES", "value": "2"} in sidecar["env"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"runtimePatches": [{"manager": "a", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
            {"name": "launcher"}]}}}}]},
         "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].name: runtime 'torch-v23' has "
         "no job 'launcher'"),
        ({"runtimePatches": [{"manager": "a", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [{"name": "trainer"}]}}}}}]}}}}]},
         "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template.spec"
         ".containers[0].name: job 'node' has no container 'trainer'"),
        ({"runtimePatches": [{"manager": "a", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [
                {"name": "node", "env": [{"name": "PET_NNODES", "value": "9"}]}]}}}}}]}}}}]},
         "'PET_NNODES' is reserved"),
        ({"runtimePatches": [{"manager": "a"}, {"manager": "a"}]}, "manager 'a' has more than one patch"),
        ({"runtimePatches": [{"manager": ""}]}, "spec.runtimePatches[0].manager"),
        ({"trainer": {"numProcPerNode": 0}}, "spec.trainer.numProcPerNode"),
        ({"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds"),
    ],
)
def test_v23_mistakes_name_their_field(spec, message):
    with pytest.raises(ValidationError) as err:
        resolve(job("torch-v23", **spec), runtime_v23())
    assert message in str(err.value)


def test_v22_policies_without_a_plugin_load_and_say_so():
    data = runtime_v23().to_dict()
    data["spec"]["mlPolicy"] = {"numNodes": 1, "jax": {}}
    jax = ClusterTrainingRuntime.from_dict(data)
    with pytest.raises(ValidationError, match="spec.mlPolicy: no installed plugin runs jax ML policy"):
        resolve(job("torch-v23", trainer=TRAINER), jax)
    with pytest.raises(ValidationError, match="containerNames: .*must not include 'node'"):
        runtime_v23(envInjection={"targets": [{"jobName": "node", "containerNames": ["node"]}]})


def test_a_v22_status_with_trainer_progress_loads():
    loaded = TrainJob.from_dict({**job("torch-v23").to_dict(), "status": {"trainerStatus": {
        "progressPercentage": 42, "estimatedRemainingSeconds": 120, "metrics": [{"name": "loss", "value": "0.4"}],
        "lastUpdatedTime": "2026-11-23T09:01:40Z"}}})
    assert loaded.status.trainer_status.progress_percentage == 42
    with pytest.raises(ValidationError, match="progressPercentage"):
        TrainJob.from_dict({**job("torch-v23").to_dict(), "status": {"trainerStatus": {
            "progressPercentage": 101, "lastUpdatedTime": "2026-11-23T09:01:40Z"}}})
