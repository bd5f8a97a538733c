"""Kubeflow's initializer images in a runtime run trainjob's initializer on the cluster, and fail fast when refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from trainjob.backends.kubernetes.children import render
from trainjob.backends.kubernetes.initializer_pods import use_trainjob_initializers
from trainjob.backends.kubernetes.workspace import add_workspace_claim
from trainjob.errors import ValidationError

IMAGE = "registry.local/trainjob-train:0.1.0"


def _replicated(name: str, container: dict[str, Any], pod: dict[str, Any] | None = None,
                job: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "template": {"spec": {**(job or {}), "template": {"spec": {**(pod or {}),
                                                                                   "containers": [container]}}}}}


def _jobset(*replicated: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "JobSet", "spec": {"replicatedJobs": list(replicated)}}


REFUSED_RULE = {"rules": [{"action": "FailJob", "onExitCodes": {"containerName": "dataset-initializer",
                                                                "operator": "In", "values": [3]}}]}

CASES = {
    "kubeflow's image, no command: trainjob's image and module, Never, fail on a refusal": (
        {"name": "dataset-initializer", "image": "ghcr.io/kubeflow/trainer/dataset-initializer"},
        {}, {},
        {"name": "dataset-initializer", "image": IMAGE,
         "command": ["python", "-m", "trainjob.initializers", "dataset"]},
        {"restartPolicy": "Never"}, {"podFailurePolicy": REFUSED_RULE},
    ),
    "a tagged image from a mirror, with kubeflow's module as its command": (
        {"name": "dataset-initializer", "image": "mirror.example:5000/kubeflow/dataset-initializer:v2.3.0",
         "command": ["python", "-m", "pkg.initializers.dataset"]},
        {}, {},
        {"name": "dataset-initializer", "image": IMAGE,
         "command": ["python", "-m", "trainjob.initializers", "dataset"]},
        {"restartPolicy": "Never"}, {"podFailurePolicy": REFUSED_RULE},
    ),
    "the runtime's own restart policy and failure policy are kept": (
        {"name": "dataset-initializer", "image": "ghcr.io/kubeflow/trainer/dataset-initializer@sha256:" + "a" * 64},
        {"restartPolicy": "OnFailure"}, {"backoffLimit": 1},
        {"name": "dataset-initializer", "image": IMAGE,
         "command": ["python", "-m", "trainjob.initializers", "dataset"]},
        {"restartPolicy": "OnFailure"}, {"backoffLimit": 1},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_kubeflow_initializer_images_become_trainjobs(case: str) -> None:
    container, pod, job, want_container, want_pod, want_job = copy.deepcopy(CASES[case])
    jobset = _jobset(_replicated("dataset-initializer", container, pod, job),
                     _replicated("node", {"name": "node", "image": "pytorch/pytorch"}))
    assert use_trainjob_initializers(jobset, IMAGE) == ["dataset-initializer"]
    first = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert first["template"]["spec"]["containers"] == [want_container]
    assert {k: v for k, v in first["template"]["spec"].items() if k != "containers"} == want_pod
    assert {k: v for k, v in first.items() if k != "template"} == want_job
    assert jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"] == [
        {"name": "node", "image": "pytorch/pytorch"}]


def test_without_an_initializer_image_the_runtime_is_left_as_it_is() -> None:
    jobset = _jobset(_replicated("dataset-initializer", {"name": "d", "image": "ghcr.io/kubeflow/trainer/"
                                                         "dataset-initializer"}))
    before = copy.deepcopy(jobset)
    assert use_trainjob_initializers(jobset, None) == [] and jobset == before


def test_other_images_are_not_initializers() -> None:
    jobset = _jobset(_replicated("prep", {"name": "prep", "image": "example.com/my-dataset-initializer-tool:1"}))
    assert use_trainjob_initializers(jobset, IMAGE) == []


def test_kubeflows_multi_step_runtime_renders_a_jobset_that_runs_trainjobs_initializer() -> None:
    """Kubeflow's examples/yaml/05-multi-step.yaml's runtime and job (its shape), through the operator's render."""
    runtime_spec = {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {"spec": {"replicatedJobs": [
            {"name": "dataset-initializer", "replicas": 1, "template": {
                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "dataset-initializer"}},
                "spec": {"template": {"spec": {"containers": [
                    {"name": "dataset-initializer", "image": "ghcr.io/kubeflow/trainer/dataset-initializer"}]}}}}},
            {"name": "node", "dependsOn": [{"name": "dataset-initializer", "status": "Complete"}], "template": {
                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "pytorch/pytorch"}]}}}}},
        ]}},
    }
    job = {"metadata": {"name": "multi-step-example", "namespace": "ml", "uid": "u1"},
           "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                   "name": "torch-with-dataset-init"},
                    "initializer": {"dataset": {"storageUri": "s3://data/alpaca",
                                                "env": [{"name": "ENDPOINT", "value": "http://s3:9000"}]}},
                    "trainer": {"numNodes": 2, "command": ["python3", "-c", "print(1)"]}}}
    snapshot = {"kind": "TrainingRuntime", "name": "torch-with-dataset-init", "labels": {}, "spec": runtime_spec}
    objects, _, _ = render(job, snapshot, IMAGE)
    assert [o["kind"] for o in objects] == ["PersistentVolumeClaim", "JobSet"]
    assert objects[0]["metadata"]["name"] == "multi-step-example-workspace"
    assert objects[0]["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    (jobset,) = [o for o in objects if o["kind"] == "JobSet"]
    dataset, node = jobset["spec"]["replicatedJobs"]
    pod = dataset["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    assert container["command"] == ["python", "-m", "trainjob.initializers", "dataset"]
    assert {e["name"]: e["value"] for e in container["env"]} == {"STORAGE_URI": "s3://data/alpaca",
                                                                  "ENDPOINT": "http://s3:9000"}
    assert pod["restartPolicy"] == "Never"
    assert dataset["template"]["spec"]["podFailurePolicy"]["rules"][0]["action"] == "FailJob"
    assert node["dependsOn"] == [{"name": "dataset-initializer", "status": "Complete"}]


def _multi_step_jobset(trainer_mounts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    initializer = _replicated("dataset-initializer", {"name": "dataset-initializer", "image": IMAGE})
    initializer["template"]["metadata"] = {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step":
                                                      "dataset-initializer"}}
    node = _replicated("node", {"name": "node", "image": IMAGE, **({"volumeMounts": trainer_mounts}
                                                                   if trainer_mounts else {})})
    node["template"]["metadata"] = {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}}
    return {"kind": "JobSet", "metadata": {"name": "multi-step", "namespace": "ml"},
            "spec": {"replicatedJobs": [initializer, node]}}


def test_initializers_and_trainer_that_share_nothing_get_one_claim_at_workspace() -> None:
    jobset = _multi_step_jobset()
    claim = add_workspace_claim(jobset, {"trainjob/workspace-size": "2Gi",
                                         "trainjob/workspace-storage-class": "nfs",
                                         "trainjob/workspace-access-mode": "ReadWriteMany"})
    assert claim == {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "metadata": {"name": "multi-step-workspace", "namespace": "ml"},
                     "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "2Gi"}},
                              "storageClassName": "nfs"}}
    for replicated in jobset["spec"]["replicatedJobs"]:
        pod = replicated["template"]["spec"]["template"]["spec"]
        assert pod["volumes"] == [{"name": "initializer", "persistentVolumeClaim": {"claimName": "multi-step-workspace"}}]
        assert pod["containers"][0]["volumeMounts"] == [{"name": "initializer", "mountPath": "/workspace"}]


@pytest.mark.parametrize("mounts", [[{"name": "data", "mountPath": "/workspace"}],
                                    [{"name": "data", "mountPath": "/workspace/dataset/"}]])
def test_a_trainer_that_mounts_its_own_workspace_gets_no_claim(mounts: list[dict[str, Any]]) -> None:
    jobset = _multi_step_jobset(mounts)
    before = copy.deepcopy(jobset)
    assert add_workspace_claim(jobset, {}) is None and jobset == before


def test_a_jobset_with_volume_claim_policies_or_without_initializers_gets_no_claim() -> None:
    with_policies = _multi_step_jobset()
    with_policies["spec"]["volumeClaimPolicies"] = [{"templates": [{"metadata": {"name": "initializer"}}]}]
    assert add_workspace_claim(with_policies, {}) is None
    plain = _multi_step_jobset()
    plain["spec"]["replicatedJobs"] = plain["spec"]["replicatedJobs"][1:]
    assert add_workspace_claim(plain, {}) is None


@pytest.mark.parametrize(("annotation", "value", "message"), [
    ("trainjob/workspace-size", "lots", "metadata.annotations[trainjob/workspace-size]: must be a storage quantity "
     "such as 10Gi, got 'lots'"),
    ("trainjob/workspace-access-mode", "ReadOnlyMany", "metadata.annotations[trainjob/workspace-access-mode]: must "
     "be one of ReadWriteOnce, ReadWriteMany, ReadWriteOncePod, got 'ReadOnlyMany'"),
])
def test_a_bad_workspace_annotation_is_refused_naming_it(annotation: str, value: str, message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        add_workspace_claim(_multi_step_jobset(), {annotation: value})
    assert str(refused.value) == message


def test_the_clusters_initializer_env_is_added_where_the_container_sets_none() -> None:
    container = {"name": "model-initializer", "image": "ghcr.io/kubeflow/trainer/model-initializer",
                 "env": [{"name": "STORAGE_URI", "value": "hf://org/tiny"}, {"name": "HF_ENDPOINT", "value": "mine"}]}
    jobset = _jobset(_replicated("model-initializer", container),
                     _replicated("node", {"name": "node", "image": "pytorch/pytorch"}))
    use_trainjob_initializers(jobset, None, {"HF_ENDPOINT": "http://mirror", "HTTPS_PROXY": "http://proxy:3128"})
    initializer, node = (rj["template"]["spec"]["template"]["spec"]["containers"][0]
                         for rj in jobset["spec"]["replicatedJobs"])
    assert initializer["env"] == [{"name": "STORAGE_URI", "value": "hf://org/tiny"},
                                  {"name": "HF_ENDPOINT", "value": "mine"},
                                  {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]
    assert initializer["image"] == "ghcr.io/kubeflow/trainer/model-initializer"  # no trainjob image: Kubeflow's
    assert "env" not in node
