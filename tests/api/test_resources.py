"""TrainJob / TrainingRuntime / ClusterTrainingRuntime: defaults, round trips, YAML files and the CRD schemas."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from trainjob.api import (
    ClusterTrainingRuntime,
    Condition,
    TrainingRuntime,
    TrainJob,
    dump_yaml,
    load_resources,
    resource_from_dict,
)
from trainjob.errors import ValidationError

FULL_TRAINJOB = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {
        "name": "llm-sft",
        "namespace": "team-a",
        "labels": {"team": "a"},
        "annotations": {"note": "x"},
    },
    "spec": {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": "torch-sft"},
        "trainer": {
            "image": "registry/sft:1",
            "command": ["torchrun", "sft.py"],
            "args": ["--lr=1e-4"],
            "env": [
                {"name": "NCCL_DEBUG", "value": "INFO"},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {
                    "name": "TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token", "optional": True}},
                },
            ],
            "numNodes": 2,
            "numProcPerNode": "gpu",
            "resourcesPerNode": {
                "requests": {"cpu": "2500m", "memory": "16Gi", "nvidia.com/gpu": 2},
                "limits": {"nvidia.com/gpu": 2},
            },
        },
        "initializer": {
            "dataset": {"storageUri": "hf://tatsu-lab/alpaca", "env": [{"name": "SPLIT", "value": "train"}]},
            "model": {"storageUri": "hf://meta-llama/Llama-3.2-1B", "secretRef": {"name": "hf"}},
        },
        "labels": {"cost-center": "42"},
        "annotations": {"scheduling.volcano.sh/queue-name": "research"},
        "podTemplateOverrides": [
            {
                "targetJobs": [{"name": "node"}],
                "metadata": {"labels": {"tier": "gpu"}},
                "spec": {
                    "serviceAccountName": "trainer",
                    "nodeSelector": {"gpu": "h100"},
                    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "volumes": [{"name": "cache", "emptyDir": {}}],
                    "containers": [
                        {"name": "node", "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}
                    ],
                    "schedulingGates": [{"name": "wait"}],
                    "imagePullSecrets": [{"name": "registry"}],
                },
            }
        ],
        "suspend": True,
        "managedBy": "trainer.kubeflow.org/trainjob-controller",
    },
    "status": {
        "conditions": [
            {
                "type": "Complete",
                "status": "True",
                "reason": "JobsCompleted",
                "message": "done",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            }
        ],
        "jobsStatus": [
            {"name": "node", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}
        ],
    },
}

FULL_RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainingRuntime",
    "metadata": {"name": "torch-sft", "namespace": "team-a"},
    "spec": {
        "mlPolicy": {
            "torch": {
                "numProcPerNode": "auto",
                "elasticPolicy": {"minNodes": 1, "maxNodes": 4, "maxRestarts": 3},
            }
        },
        "podGroupPolicy": {"volcano": {"networkTopology": {"mode": "soft", "highestTierAllowed": 2}}},
        "template": {
            "metadata": {"labels": {"framework": "torch"}},
            "spec": {
                "network": {"publishNotReadyAddresses": True},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": ["node"]},
                "failurePolicy": {"maxRestarts": 2},
                "ttlSecondsAfterFinished": 600,
                "replicatedJobs": [
                    {
                        "name": "node",
                        "replicas": 1,
                        "template": {"spec": {"template": {"spec": {"containers": []}}}},
                    }
                ],
            },
        },
    },
}


def test_a_trainjob_with_every_field_round_trips_unchanged():
    job = TrainJob.from_dict(FULL_TRAINJOB)
    assert job.to_dict() == FULL_TRAINJOB
    assert job.spec.trainer.resources_per_node.requests["nvidia.com/gpu"] == 2
    assert job.status.condition("Complete").reason == "JobsCompleted"


def test_a_runtime_with_every_policy_round_trips_unchanged():
    assert TrainingRuntime.from_dict(FULL_RUNTIME).to_dict() == FULL_RUNTIME


def test_resources_with_every_field_fit_the_kubeflow_crds(crd_errors):
    assert crd_errors(TrainJob.from_dict(FULL_TRAINJOB).to_dict()) == []
    assert crd_errors(TrainingRuntime.from_dict(FULL_RUNTIME).to_dict()) == []
    cluster = {**copy.deepcopy(FULL_RUNTIME), "kind": "ClusterTrainingRuntime", "metadata": {"name": "c"}}
    cluster["spec"]["mlPolicy"] = {
        "numNodes": 2,
        "mpi": {"numProcPerNode": 4, "mpiImplementation": "OpenMPI"},
    }
    cluster["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 120}}
    assert crd_errors(ClusterTrainingRuntime.from_dict(cluster).to_dict()) == []


def test_active_deadline_seconds_is_the_one_extension_the_crd_does_not_know(crd_errors):
    job = copy.deepcopy(FULL_TRAINJOB)
    job["spec"]["activeDeadlineSeconds"] = 3600
    dumped = TrainJob.from_dict(job).to_dict()
    assert dumped["spec"]["activeDeadlineSeconds"] == 3600
    assert crd_errors(dumped) == [
        "spec: Additional properties are not allowed ('activeDeadlineSeconds' was unexpected)"
    ]


def test_defaults_are_filled_the_way_the_api_server_fills_them():
    job = TrainJob.from_dict(
        {"metadata": {"name": "a"}, "spec": {"runtimeRef": {"name": "torch-distributed"}}}
    )
    assert job.namespace == "default"
    assert job.to_dict()["spec"]["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    runtime = ClusterTrainingRuntime.from_dict(
        {
            "metadata": {"name": "r"},
            "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {}}]}}},
        }
    )
    assert runtime.metadata.namespace is None


def test_num_proc_per_node_reads_digit_strings_as_integers_and_keeps_keywords():
    def npn(value):
        spec = {"runtimeRef": {"name": "r"}, "trainer": {"numProcPerNode": value}}
        return TrainJob.from_dict({"metadata": {"name": "a"}, "spec": spec}).spec.trainer.num_proc_per_node

    assert [npn("8"), npn(8), npn("auto"), npn("cpu"), npn("gpu")] == [8, 8, "auto", "cpu", "gpu"]


def test_snake_case_attributes_construct_the_same_resource():
    job = TrainJob(metadata={"name": "a"}, spec={"runtime_ref": {"name": "r"}, "trainer": {"num_nodes": 3}})
    assert job.to_dict()["spec"]["trainer"] == {"numNodes": 3}


def test_conditions_get_a_transition_time_and_a_reason_that_fit_the_crd(crd_errors):
    job = TrainJob.from_dict({"metadata": {"name": "a"}, "spec": {"runtimeRef": {"name": "r"}}})
    job.status = {"conditions": [Condition(type="Created", status="True")]}
    dumped = job.to_dict()
    assert dumped["status"]["conditions"][0]["lastTransitionTime"].endswith("Z")
    assert crd_errors(dumped) == []


MULTI = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: r}
spec:
  template: {spec: {replicatedJobs: [{name: node, template: {}}]}}
---
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: a}
spec: {runtimeRef: {name: r}}
"""


def test_load_resources_reads_multi_document_text_and_files_alike(tmp_path: Path):
    path = tmp_path / "all.yaml"
    path.write_text(MULTI)
    from_text, from_path, from_str = load_resources(MULTI), load_resources(path), load_resources(str(path))
    assert [r.kind for r in from_text] == ["ClusterTrainingRuntime", "TrainJob"]
    assert from_text == from_path == from_str


def test_dump_yaml_puts_api_version_kind_metadata_spec_first_and_loads_back():
    resources = load_resources(MULTI)
    text = dump_yaml(resources)
    assert text.startswith(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\nmetadata:"
    )
    assert load_resources(text) == resources


def test_errors_in_multi_document_files_name_the_document():
    bad = MULTI.replace(
        "spec: {runtimeRef: {name: r}}", "spec: {runtimeRef: {name: r}, trainer: {numNodes: 0}}"
    )
    with pytest.raises(ValidationError) as err:
        load_resources(bad)
    assert str(err.value) == "documents[1].spec.trainer.numNodes: must be >= 1, got 0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # the words after the position are the parser's (libyaml's where installed, else PyYAML's)
        ("a: [\n", "<text>: not valid YAML: line 2, column 1: "),
        ("- 1\n- 2\n", "a resource must be a mapping, got list"),
        (
            "apiVersion: v1\nkind: Pod\n",
            "kind: must be one of TrainJob, TrainingRuntime, ClusterTrainingRuntime, got 'Pod'",
        ),
        (
            "apiVersion: kubeflow.org/v1\nkind: TrainJob\n",
            "apiVersion: must be trainer.kubeflow.org/v1alpha1, got 'kubeflow.org/v1'",
        ),
    ],
)
def test_load_resources_rejects_what_is_not_a_resource_of_ours(text, message):
    with pytest.raises(ValidationError) as err:
        load_resources(text)
    assert str(err.value) == message or (message.endswith(": ") and str(err.value).startswith(message))


def test_a_missing_file_is_a_validation_error_naming_it(tmp_path: Path):
    with pytest.raises(ValidationError, match=r"missing\.yaml: cannot read: No such file or directory"):
        load_resources(tmp_path / "missing.yaml")


def test_resource_from_dict_picks_the_model_by_kind():
    runtime = resource_from_dict(FULL_RUNTIME)
    assert isinstance(runtime, TrainingRuntime) and runtime.metadata.namespace == "team-a"
