"""A runtime's free-form job templates: every malformed shape is a validation error naming the field path when
the runtime is read, so resolving and rendering never meet one; sizes that would make a plan huge are refused."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from trainjob.api import ClusterTrainingRuntime, TrainJob
from trainjob.errors import ValidationError
from trainjob.runtime import resolve
from trainjob.runtime.render import render_objects

POD = "spec.template.spec.replicatedJobs[0].template.spec.template.spec"
NODE: dict[str, Any] = {
    "name": "node",
    "template": {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
        "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "torch:1"}]}}},
    },
}


def runtime_with(path: str, value: Any, *, policy: dict | None = None) -> dict[str, Any]:
    """The ``rt`` runtime dict with the dotted ``path`` inside the node job's template set to ``value``."""
    node = copy.deepcopy(NODE)
    *parents, last = path.split(".")
    target = node["template"]
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target.setdefault(key, {})
    target[last] = value
    return {
        "metadata": {"name": "rt"},
        "spec": {"mlPolicy": policy or {"torch": {}}, "template": {"spec": {"replicatedJobs": [node]}}},
    }


CONTAINER = "spec.template.spec.containers.0"
MALFORMED = [
    (f"{CONTAINER}.ports", [{"name": "x"}], f"{POD}.containers[0].ports[0].containerPort: required field is missing"),
    (
        f"{CONTAINER}.ports",
        [{"containerPort": 70000}],
        f"{POD}.containers[0].ports[0].containerPort: must be <= 65535, got 70000",
    ),
    ("spec.template.spec.containers", ["node"], f"{POD}.containers[0]: must be a mapping, got 'node'"),
    (f"{CONTAINER}.name", {"a": 1}, f"{POD}.containers[0].name: must be a string, got {{'a': 1}}"),
    (f"{CONTAINER}.name", "", f"{POD}.containers[0].name: must not be empty, got ''"),
    (f"{CONTAINER}.env", ["A=1"], f"{POD}.containers[0].env[0]: must be a mapping, got 'A=1'"),
    (f"{CONTAINER}.env", [{"name": {"a": 1}}], f"{POD}.containers[0].env[0].name: must be a string, got {{'a': 1}}"),
    (f"{CONTAINER}.command", "torchrun", f"{POD}.containers[0].command: must be a list, got 'torchrun'"),
    (f"{CONTAINER}.resources", "big", f"{POD}.containers[0].resources: must be a mapping, got 'big'"),
    (
        f"{CONTAINER}.resources",
        {"requests": {"cpu": "1e9999"}},
        f"{POD}.containers[0].resources.requests.cpu: must be at most 9.22E+18 in size, got '1e9999'",
    ),
    (f"{CONTAINER}.volumeMounts", [{"name": "x"}], f"{POD}.containers[0].volumeMounts[0].mountPath: required field is missing"),
    ("spec.template.spec.volumes", ["data"], f"{POD}.volumes[0]: must be a mapping, got 'data'"),
    ("spec.template.spec.nodeSelector", ["gpu"], f"{POD}.nodeSelector: must be a mapping, got ['gpu']"),
    ("spec.template.spec.initContainers", [{"image": "x"}], f"{POD}.initContainers[0].name: required field is missing"),
    (
        "spec.template.spec.initContainers",
        [{"name": "node"}],
        f"{POD}: container names (initContainers included) must be unique in a pod, got node more than once",
    ),
    ("spec.template.spec", "pod", "spec.template.spec.replicatedJobs[0].template.spec.template.spec: must be a mapping, got 'pod'"),
    ("spec.parallelism", "abc", "spec.template.spec.replicatedJobs[0].template.spec.parallelism: must be an integer, got 'abc'"),
    (
        "metadata.labels",
        ["trainer"],
        "spec.template.spec.replicatedJobs[0].template.metadata.labels: must be a mapping, got ['trainer']",
    ),
    (
        "spec.template.metadata.annotations",
        {"a": 1},
        "spec.template.spec.replicatedJobs[0].template.spec.template.metadata.annotations.a: must be a string, got 1",
    ),
]


@pytest.mark.parametrize(("path", "value", "message"), MALFORMED, ids=[m[0] + ":" + repr(m[1])[:20] for m in MALFORMED])
def test_malformed_template_is_a_validation_error_naming_the_path(path, value, message):
    with pytest.raises(ValidationError) as err:
        ClusterTrainingRuntime.from_dict(runtime_with(path, value))
    assert str(err.value) == message


def test_null_fields_of_a_template_are_dropped_and_it_still_renders():
    runtime = runtime_with("spec.template.spec.nodeSelector", None)
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    node["metadata"]["annotations"] = None
    node["spec"]["template"]["metadata"] = None
    node["spec"]["template"]["spec"]["tolerations"] = None
    job = TrainJob.from_dict(
        {
            "metadata": {"name": "mnist"},
            "spec": {
                "runtimeRef": {"name": "rt"},
                "podTemplateOverrides": [
                    {"targetJobs": [{"name": "node"}], "spec": {"nodeSelector": {"pool": "a"}, "tolerations": [{}]}}
                ],
            },
        }
    )
    (jobset,) = render_objects(resolve(job, ClusterTrainingRuntime.from_dict(runtime)))
    pod_spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"pool": "a"} and pod_spec["tolerations"] == [{}]


def test_auto_processes_per_node_past_the_limit_is_refused(make_job, make_runtime):
    runtime = make_runtime(mlPolicy={"torch": {"numProcPerNode": "auto"}}, container={"resources": {"requests": {"cpu": "1e9"}}})
    with pytest.raises(ValidationError) as err:
        resolve(make_job(runtime="rt"), runtime)
    assert str(err.value) == (
        "spec.mlPolicy.torch.numProcPerNode: (in ClusterTrainingRuntime 'rt') is 'auto', which gives one process per "
        "requested CPU: 1000000000 per node; at most 1024 are allowed: request fewer CPUs or set an integer"
    )


def test_long_lists_in_templates_and_overrides_resolve_in_linear_time(make_job):
    volumes = [{"name": f"v{i}", "emptyDir": {}} for i in range(10_000)]
    runtime = ClusterTrainingRuntime.from_dict(runtime_with("spec.template.spec.volumes", volumes))
    mounts = [{"name": f"v{i}", "mountPath": f"/m{i}"} for i in range(2_000)]
    overrides = [
        {
            "targetJobs": [{"name": "node"}],
            "spec": {
                "volumes": [{"name": f"v{i}", "hostPath": {"path": "/x"}} for i in range(0, 20_000, 2)],
                "containers": [{"name": "node", "volumeMounts": mounts}],
            },
        }
    ]
    job = make_job(runtime="rt", spec={"podTemplateOverrides": overrides})
    start = time.perf_counter()
    (jobset,) = render_objects(resolve(job, runtime))
    # Real clock on purpose: guards against quadratic merging (a scan per addition takes minutes).
    assert time.perf_counter() - start < 5
    merged = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["volumes"]
    assert len(merged) == 15_000 and merged[0] == {"name": "v0", "hostPath": {"path": "/x"}}
    assert merged[1] == {"name": "v1", "emptyDir": {}} and merged[-1]["name"] == "v19998"
