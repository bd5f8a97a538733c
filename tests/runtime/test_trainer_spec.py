"""The TrainJob's initializer settings and podTemplateOverrides applied to the runtime's jobs."""

from __future__ import annotations

import pytest

from trainjob.errors import ValidationError
from trainjob.runtime import builtin_runtimes, resolve


def _pod_spec(pod_set):
    return pod_set.template["spec"]["template"]["spec"]


def test_dataset_storage_uri_and_env_reach_the_initializer_container(
    make_job, make_runtime, dataset_initializer_job
):
    job = make_job(
        runtime="rt",
        spec={
            "initializer": {
                "dataset": {
                    "storageUri": "hf://tatsu-lab/alpaca",
                    "env": [{"name": "SPLIT", "value": "train"}],
                    "secretRef": {"name": "hf"},
                }
            }
        },
    )
    plan = resolve(job, make_runtime(mlPolicy={"torch": {}}, jobs=[dataset_initializer_job]))
    dataset = next(p for p in plan.pod_sets if p.name == "dataset-initializer")
    assert dataset.container().env_dict() == {"STORAGE_URI": "hf://tatsu-lab/alpaca", "SPLIT": "train"}
    assert _pod_spec(dataset)["containers"][0]["envFrom"] == [{"secretRef": {"name": "hf"}}]
    assert dataset.count == 1 and plan.trainer().count == 1


def test_an_initializer_the_runtime_lacks_is_added_and_the_trainer_waits_for_it(make_job):
    job = make_job(spec={"initializer": {"model": {"storageUri": "hf://org/tiny",
                                                   "env": [{"name": "ACCESS_TOKEN", "value": "t"}]}}})
    plan = resolve(job, builtin_runtimes()["torch-distributed"])
    assert [p.name for p in plan.pod_sets] == ["model-initializer", "node"]
    model = plan.pod_sets[0]
    assert model.ancestor_step == "model-initializer" and model.count == 1
    assert model.container().image == "ghcr.io/kubeflow/trainer/model-initializer"
    assert model.container().env_dict() == {"STORAGE_URI": "hf://org/tiny", "ACCESS_TOKEN": "t"}
    assert model.template["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "model-initializer"}
    assert plan.trainer().depends_on == [{"name": "model-initializer", "status": "Complete"}]


def test_overrides_apply_in_order_and_later_entries_win(make_job, make_runtime):
    first = {
        "targetJobs": [{"name": "node"}],
        "spec": {"nodeSelector": {"pool": "a", "zone": "1"}, "volumes": [{"name": "v", "emptyDir": {}}]},
    }
    second = {
        "targetJobs": [{"name": "node"}],
        "spec": {"nodeSelector": {"pool": "b"}, "volumes": [{"name": "v", "hostPath": {"path": "/d"}}]},
    }
    plan = resolve(
        make_job(runtime="rt", spec={"podTemplateOverrides": [first, second]}),
        make_runtime(mlPolicy={"torch": {}}),
    )
    spec = _pod_spec(plan.trainer())
    assert spec["nodeSelector"] == {"pool": "b", "zone": "1"}
    assert spec["volumes"] == [{"name": "v", "hostPath": {"path": "/d"}}]


def test_overrides_only_touch_the_target_jobs(make_job, make_runtime, dataset_initializer_job):
    override = {
        "targetJobs": [{"name": "dataset-initializer"}],
        "spec": {"serviceAccountName": "reader"},
        "metadata": {"annotations": {"a": "b"}},
    }
    plan = resolve(
        make_job(runtime="rt", spec={"podTemplateOverrides": [override]}),
        make_runtime(mlPolicy={"torch": {}}, jobs=[dataset_initializer_job]),
    )
    dataset = next(p for p in plan.pod_sets if p.name == "dataset-initializer")
    assert _pod_spec(dataset)["serviceAccountName"] == "reader"
    assert dataset.template["spec"]["template"]["metadata"]["annotations"] == {"a": "b"}
    assert "serviceAccountName" not in _pod_spec(plan.trainer())


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"targetJobs": [{"name": "worker"}]},
            "spec.podTemplateOverrides[0].targetJobs[0].name: runtime 'torch-distributed' has no job 'worker' "
            "(jobs: node)",
        ),
        (
            {"targetJobs": [{"name": "node"}], "spec": {"containers": [{"name": "sidecar"}]}},
            "spec.podTemplateOverrides[0].spec.containers[0].name: job 'node' has no container 'sidecar' "
            "(containers: node)",
        ),
        (
            {"targetJobs": [{"name": "node"}], "spec": {"initContainers": [{"name": "setup"}]}},
            "spec.podTemplateOverrides[0].spec.initContainers[0].name: job 'node' has no initContainer 'setup' "
            "(initContainers: none)",
        ),
    ],
    ids=["unknown_job", "unknown_container", "unknown_init_container"],
)
def test_overrides_must_name_existing_jobs_and_containers(make_job, override, message):
    with pytest.raises(ValidationError) as err:
        resolve(make_job(spec={"podTemplateOverrides": [override]}), builtin_runtimes()["torch-distributed"])
    assert str(err.value) == message
