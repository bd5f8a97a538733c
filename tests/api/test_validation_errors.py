"""Each validation error names the field path, the bad value and what is accepted."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from trainjob.api import ClusterTrainingRuntime, TrainJob
from trainjob.errors import ValidationError

JOB: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "mnist"},
    "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}},
}
RUNTIME: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch"},
    "spec": {
        "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
        "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {}}]}},
    },
}


def _with(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``base`` with the dotted ``path`` set to ``value`` (``...`` deletes it)."""
    out = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if value is ...:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


TRAINJOB_ERRORS = [
    ("spec.trainer.numNodes", 0, "spec.trainer.numNodes: must be >= 1, got 0"),
    ("spec.trainer.numNodes", "4", "spec.trainer.numNodes: must be an integer, got '4'"),
    ("spec.trainer.numNodes", 10_001, "spec.trainer.numNodes: must be <= 10000, got 10001"),
    ("spec.trainer.numNodes", 2**31 - 1, "spec.trainer.numNodes: must be <= 10000, got 2147483647"),
    (
        "spec.trainer.numProcPerNode",
        1025,
        "spec.trainer.numProcPerNode: must be at most 1024 processes per node, got 1025",
    ),
    (
        "spec.trainer.numProcPerNode",
        "\u0663",  # ARABIC-INDIC DIGIT THREE: str.isdigit() says yes, Kubernetes says no
        "spec.trainer.numProcPerNode: must be auto, cpu, gpu or an integer >= 1, got '\u0663'",
    ),
    (
        "spec.trainer.numProcPerNode",
        "8" * 5000,
        f"spec.trainer.numProcPerNode: must be auto, cpu, gpu or an integer >= 1, got '{'8' * 37}...{'8' * 38}'",
    ),
    (
        "spec.trainer.resourcesPerNode",
        {"requests": {"cpu": "1e9999"}},
        "spec.trainer.resourcesPerNode.requests.cpu: must be at most 9.22E+18 in size, got '1e9999'",
    ),
    (
        "spec.trainer.resourcesPerNode",
        {"limits": {"memory": "-1Gi"}},
        "spec.trainer.resourcesPerNode.limits.memory: must not be negative, got '-1Gi'",
    ),
    ("spec.trainer.image", 10**5000, "spec.trainer.image: must be a string, got <an integer of about 5001 digits>"),
    (
        "spec.trainer.numProcPerNode",
        "abc",
        "spec.trainer.numProcPerNode: must be auto, cpu, gpu or an integer >= 1, got 'abc'",
    ),
    (
        "spec.trainer.numProcPerNode",
        0,
        "spec.trainer.numProcPerNode: must be auto, cpu, gpu or an integer >= 1, got 0",
    ),
    (
        "spec.trainer.numNodez",
        3,
        "spec.trainer.numNodez: unknown field 'numNodez'; accepted fields: image, command, args, env, numNodes, "
        "numProcPerNode, resourcesPerNode",
    ),
    ("spec.runtimeRef", ..., "spec.runtimeRef: required field is missing"),
    ("spec.runtimeRef.name", "", "spec.runtimeRef.name: must not be empty, got ''"),
    (
        "spec.runtimeRef.kind",
        "Runtime",
        "spec.runtimeRef.kind: must be 'ClusterTrainingRuntime' or 'TrainingRuntime', got 'Runtime'",
    ),
    ("spec.trainer.image", 5, "spec.trainer.image: must be a string, got 5"),
    (
        "spec.trainer.command",
        "python train.py",
        "spec.trainer.command: must be a list, got 'python train.py'",
    ),
    ("spec.trainer.env", [{"value": "1"}], "spec.trainer.env[0].name: required field is missing"),
    (
        "spec.trainer.resourcesPerNode",
        {"requests": {"cpu": "two"}},
        "spec.trainer.resourcesPerNode.requests.cpu: must be a quantity (a number with an optional suffix: n, u, m, "
        "k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or e<exponent>), got 'two'",
    ),
    (
        "spec.trainer.resourcesPerNode",
        {"limits": {"nvidia.com/gpu": "1x"}},
        "spec.trainer.resourcesPerNode.limits[nvidia.com/gpu]: must be a quantity (a number with an optional "
        "suffix: n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or e<exponent>), got '1x'",
    ),
    ("spec.suspend", "yes", "spec.suspend: must be true or false, got 'yes'"),
    ("spec.activeDeadlineSeconds", 0, "spec.activeDeadlineSeconds: must be >= 1, got 0"),
    (
        "spec.activeDeadlineSeconds",
        2**63,
        "spec.activeDeadlineSeconds: must be <= 9223372036854775807, got 9223372036854775808",
    ),
    (
        "spec.managedBy",
        "me",
        "spec.managedBy: must be one of trainer.kubeflow.org/trainjob-controller, kueue.x-k8s.io/multikueue, "
        "got 'me'",
    ),
    (
        "spec.podTemplateOverrides",
        [{"targetJobs": []}],
        "spec.podTemplateOverrides[0].targetJobs: must not be empty, got []",
    ),
    (
        "metadata.name",
        "MNIST_job",
        "metadata.name: must be a DNS label (lowercase letters, digits and '-', starting with a letter), "
        "got 'MNIST_job'",
    ),
    ("metadata.name", "a" * 64, f"metadata.name: must be at most 63 characters, got 64 ('{'a' * 64}')"),
    (
        "metadata.name",
        "mnist\n",
        "metadata.name: must be a DNS label (lowercase letters, digits and '-', starting with a letter), "
        "got 'mnist\\n'",
    ),
    (
        "metadata.namespace",
        "ml-team\n",
        "metadata.namespace: must be a namespace name (at most 63 lowercase letters, digits and '-'), "
        "got 'ml-team\\n'",
    ),
    ("metadata", ..., "metadata: required field is missing"),
    ("kind", "Job", "kind: must be 'TrainJob', got 'Job'"),
    (
        "status.conditions",
        [{"type": "Complete", "status": "yes"}],
        "status.conditions[0].status: must match ^(True|False|Unknown)$, got 'yes'",
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "message"), TRAINJOB_ERRORS, ids=[e[2].split(":")[0] for e in TRAINJOB_ERRORS]
)
def test_trainjob_error_names_path_value_and_accepted(path, value, message):
    with pytest.raises(ValidationError) as err:
        TrainJob.from_dict(_with(JOB, path, value))
    assert str(err.value) == message


RUNTIME_ERRORS = [
    ("spec.mlPolicy.numNodes", 0, "spec.mlPolicy.numNodes: must be >= 1, got 0"),
    ("spec.mlPolicy.numNodes", 2**31 - 1, "spec.mlPolicy.numNodes: must be <= 10000, got 2147483647"),
    (
        "spec.mlPolicy",
        {"torch": {"elasticPolicy": {"maxNodes": 10_001}}},
        "spec.mlPolicy.torch.elasticPolicy.maxNodes: must be <= 10000, got 10001",
    ),
    ("spec.mlPolicy", {"mpi": {"numProcPerNode": 5000}}, "spec.mlPolicy.mpi.numProcPerNode: must be <= 1024, got 5000"),
    (
        "metadata.name",
        "torch\n",
        "metadata.name: must be a DNS subdomain (lowercase letters, digits, '-' and '.'), got 'torch\\n'",
    ),
    (
        "spec.mlPolicy.torch.elasticPolicy",
        {"minNodes": 1, "maxNodes": 4},
        "spec.mlPolicy: numNodes must not be set together with torch.elasticPolicy "
        "(the node count comes from elasticPolicy minNodes..maxNodes)",
    ),
    (
        "spec.mlPolicy",
        {"torch": {"elasticPolicy": {"minNodes": 5, "maxNodes": 4}}},
        "spec.mlPolicy.torch.elasticPolicy: minNodes (5) must be <= maxNodes (4)",
    ),
    (
        "spec.mlPolicy",
        {"torch": {"elasticPolicy": {"minNodes": 1}}},
        "spec.mlPolicy.torch.elasticPolicy.maxNodes: required field is missing",
    ),
    ("spec.mlPolicy.mpi", {"numProcPerNode": 1}, "spec.mlPolicy: only one of torch, mpi, flux, jax and xgboost can be set, got torch, mpi"),
    (
        "spec.mlPolicy.torch.numProcPerNode",
        "all",
        "spec.mlPolicy.torch.numProcPerNode: must be auto, cpu, gpu or an integer >= 1, got 'all'",
    ),
    (
        "spec.podGroupPolicy",
        {"coscheduling": {}, "volcano": {}},
        "spec.podGroupPolicy: only one of coscheduling and volcano can be set",
    ),
    (
        "spec.podGroupPolicy",
        {"volcano": {"networkTopology": {"mode": "strict"}}},
        "spec.podGroupPolicy.volcano.networkTopology.mode: must be 'hard' or 'soft', got 'strict'",
    ),
    ("spec.template.spec.replicatedJobs", [], "spec.template.spec.replicatedJobs: must not be empty, got []"),
    (
        "spec.template.spec.replicatedJobs",
        [{"name": "node", "template": {}}, {"name": "node", "template": {}}],
        "spec.template.spec.replicatedJobs: replicated job names must be unique, got node more than once",
    ),
    (
        "spec.template.spec.replicatedJobs.0.name",
        "Node",
        "spec.template.spec.replicatedJobs[0].name: must be a DNS label (lowercase letters, digits and '-', "
        "starting with a letter), got 'Node'",
    ),
    (
        "spec.template.spec.replicas",
        2,
        "spec.template.spec.replicas: unknown field 'replicas'; accepted fields: replicatedJobs, network, "
        "successPolicy, failurePolicy, startupPolicy, coordinator, managedBy, suspend, ttlSecondsAfterFinished, "
        "volumeClaimPolicies",
    ),
    ("spec.template", ..., "spec.template: required field is missing"),
]


@pytest.mark.parametrize(
    ("path", "value", "message"), RUNTIME_ERRORS, ids=[e[2].split(":")[0] for e in RUNTIME_ERRORS]
)
def test_runtime_error_names_path_value_and_accepted(path, value, message):
    with pytest.raises(ValidationError) as err:
        ClusterTrainingRuntime.from_dict(_with(RUNTIME, path, value))
    assert str(err.value) == message


def test_every_problem_is_reported_one_per_line_with_the_first_as_path():
    bad = _with(_with(JOB, "spec.trainer.numNodes", 0), "spec.trainer.image", 1)
    with pytest.raises(ValidationError) as err:
        TrainJob.from_dict(bad)
    assert str(err.value).splitlines() == [
        "spec.trainer.image: must be a string, got 1",
        "spec.trainer.numNodes: must be >= 1, got 0",
    ]
    assert err.value.path == "spec.trainer.image"
    assert [e.path for e in err.value.errors] == ["spec.trainer.image", "spec.trainer.numNodes"]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.trainer.numNodes", "4" * 10**6),
        ("metadata.name", "a" * 10**6),
        ("spec.runtimeRef.kind", "k" * 10**6),
        ("spec.managedBy", "m" * 10**6),
        ("spec.trainer.resourcesPerNode", {"requests": {"cpu": "9" * 10**6}}),
        ("spec.trainer.resourcesPerNode", {"requests": {"c" * 10**6: "x"}}),
        ("spec.labels", {"l" * 10**6: 1}),
        ("spec.trainer.numNodez" + "z" * 10**6, 1),
        ("spec.trainer.command", [["x" * 10**6] * 10**4]),
    ],
    ids=["integer", "name", "literal", "choice", "quantity", "map-key", "key-in-path", "unknown-field", "nested"],
)
def test_error_messages_cut_long_values_short(path, value):
    with pytest.raises(ValidationError) as err:
        TrainJob.from_dict(_with(JOB, path, value))
    lines = str(err.value).splitlines()
    assert len(lines) == 1 and len(lines[0]) < 400 and "..." in lines[0]


def test_many_problems_are_counted_not_all_listed():
    with pytest.raises(ValidationError) as err:
        TrainJob.from_dict(_with(JOB, "spec.trainer.env", [{"value": "1"}] * 10_000))
    lines = str(err.value).splitlines()
    assert lines[:2] == [
        "spec.trainer.env[0].name: required field is missing",
        "spec.trainer.env[1].name: required field is missing",
    ]
    assert len(lines) == 21 and lines[-1] == "... and 9980 more problem(s)"
