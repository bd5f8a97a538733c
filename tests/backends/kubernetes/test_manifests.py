"""The shipped CRDs and install manifests: structural, accepted by Kubernetes' schemas, in sync with deploy/, and
agreeing with trainjob.api on the seeds' YAML (accepted) and on bad input (rejected)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubetest.cluster import TrainJobCluster
from kubetest.reference import reference_file
from kubetest.schemas import kubernetes_problems, schema_problems, strict

from trainjob.api import TrainJob
from trainjob.backends.kubernetes.crds import crd_schema, custom_resource_definitions
from trainjob.backends.kubernetes.manifests import CREATE_ONLY_ANNOTATION, deploy_files, install_manifests
from trainjob.backends.kubernetes.resources import CLUSTER_TRAINING_RUNTIMES
from trainjob.cli.main import main
from trainjob.errors import ValidationError

REPO = Path(__file__).resolve().parents[3]
SEEDS = REPO.parent / "shared" / "seeds"
CRDS = {crd["spec"]["names"]["kind"]: crd for crd in custom_resource_definitions()}
VALIDATORS = {kind: jsonschema.Draft7Validator(strict(crd_schema(crd))) for kind, crd in CRDS.items()}


def seed_documents() -> list[tuple[str, dict[str, Any]]]:
    """Every trainer.kubeflow.org document in the seeds' YAML blocks and the reference runtime manifest."""
    docs = []
    for path in sorted(SEEDS.glob("*.txt")):
        for index, block in enumerate(re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S)):
            for doc in yaml.safe_load_all(block):
                if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith(
                    "trainer.kubeflow.org/"
                ):
                    docs.append((f"{path.name}#{index}:{doc['metadata']['name']}", doc))
    if not docs:  # no ../shared beside the clone: the copies of seed 000's manifests kept with the API tests
        for path in sorted((REPO / "tests" / "api" / "seed_manifests").glob("*.yaml")):
            docs.append((path.name, yaml.safe_load(path.read_text())))
    try:  # Kubeflow Trainer v2.1.0's own runtime manifest, from its Go module
        runtime = reference_file("kubeflow", "torch_distributed.yaml")
        docs.append(("torch_distributed.yaml", yaml.safe_load(runtime.read_text())))
    except LookupError:
        pass
    return docs


SEED_DOCS = seed_documents()


def test_the_seeds_hold_trainjobs_and_runtimes() -> None:
    kinds = sorted({doc["kind"] for _, doc in SEED_DOCS})
    assert kinds == ["ClusterTrainingRuntime", "TrainJob"] and len(SEED_DOCS) >= 5


@pytest.mark.parametrize(("where", "doc"), SEED_DOCS, ids=[w for w, _ in SEED_DOCS])
def test_shipped_crds_accept_the_seeds_yaml(where: str, doc: dict[str, Any]) -> None:
    assert schema_problems(VALIDATORS[doc["kind"]], doc) == []


GOOD_SPEC = {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}}


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"trainer": {"numNodes": 2}}, "spec"),
        ({**GOOD_SPEC, "trainer": {"numNodes": 0}}, "spec.trainer.numNodes"),
        ({**GOOD_SPEC, "trainer": {"numNodes": "2"}}, "spec.trainer.numNodes"),
        ({**GOOD_SPEC, "trainer": {"gpus": 2}}, "spec.trainer"),
        ({**GOOD_SPEC, "runtimeRef": {"name": "x", "kind": "Deployment"}}, "spec.runtimeRef.kind"),
        ({**GOOD_SPEC, "runtimeRef": {"name": ""}}, "spec.runtimeRef.name"),
        ({**GOOD_SPEC, "activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds"),
        ({**GOOD_SPEC, "suspend": "yes"}, "spec.suspend"),
        ({**GOOD_SPEC, "trainer": {"env": [{"value": "x"}]}}, "spec.trainer.env.0"),
    ],
    ids=[
        "no-runtime-ref",
        "zero-nodes",
        "nodes-as-string",
        "unknown-field",
        "bad-kind",
        "empty-runtime-name",
        "zero-deadline",
        "suspend-not-bool",
        "env-without-name",
    ],
)
def test_shipped_crd_rejects_what_the_api_rejects(spec: dict[str, Any], path: str) -> None:
    doc = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "j"},
        "spec": spec,
    }

    problems = schema_problems(VALIDATORS["TrainJob"], doc)

    assert problems and problems[0].startswith(path), problems
    with pytest.raises(ValidationError):
        TrainJob.from_dict(doc)


def test_rules_json_schema_cannot_state_are_cel_validations() -> None:
    schema = crd_schema(CRDS["TrainJob"])
    num_proc = schema["properties"]["spec"]["properties"]["trainer"]["properties"]["numProcPerNode"]
    assert num_proc["x-kubernetes-int-or-string"] is True
    assert "['auto', 'cpu', 'gpu']" in num_proc["x-kubernetes-validations"][0]["rule"]
    assert "metadata.name" in schema["x-kubernetes-validations"][0]["rule"]
    template = crd_schema(CRDS["ClusterTrainingRuntime"])["properties"]["spec"]["properties"]["template"]
    replicated = template["properties"]["spec"]["properties"]["replicatedJobs"]["items"]
    assert replicated["properties"]["template"]["x-kubernetes-preserve-unknown-fields"] is True


def structural_problems(node: dict[str, Any], path: str = "") -> list[str]:
    """Violations of the apiextensions v1 structural schema rules this generator could make."""
    problems = [f"{path}: {key}" for key in ("$ref", "$defs", "const", "title", "oneOf") if key in node]
    typed = (
        node.get("type")
        or node.get("x-kubernetes-int-or-string")
        or node.get("x-kubernetes-preserve-unknown-fields")
    )
    if not typed:
        problems.append(f"{path}: no type")
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        problems.append(f"{path}: anyOf")
    if node.get("additionalProperties") is False or ("additionalProperties" in node and "properties" in node):
        problems.append(f"{path}: additionalProperties with properties")
    for name, child in (node.get("properties") or {}).items():
        problems += structural_problems(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        problems += structural_problems(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        problems += structural_problems(node["additionalProperties"], f"{path}{{}}")
    return problems


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_crd_schemas_are_structural(kind: str) -> None:
    assert structural_problems(crd_schema(CRDS[kind])) == []


def test_every_install_manifest_passes_kubernetes_schemas() -> None:
    objects = install_manifests()
    builtin = [o for o in objects if not o["apiVersion"].startswith("trainer.kubeflow.org/")]
    runtimes = [o for o in objects if o["kind"] == CLUSTER_TRAINING_RUNTIMES.kind]

    assert [p for o in builtin for p in kubernetes_problems(o)] == []
    assert [p for o in runtimes for p in schema_problems(VALIDATORS[o["kind"]], o)] == []
    assert [o["metadata"]["name"] for o in runtimes] == [
        "deepspeed-distributed", "mpi-distributed", "ray-distributed", "torch-distributed",
        "torch-distributed-volcano", "torchtune-llama3.2-1b", "torchtune-llama3.2-3b", "torchtune-qwen2.5-1.5b",
    ]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {"livenessProbe", "readinessProbe", "resources"} <= set(container)


def test_rbac_never_grants_what_would_let_the_operator_escalate() -> None:
    """What the operator must never hold, whatever it needs (the audit test checks the rest against reality).

    It may delete TrainJobs (finished ones past their TTL annotation), never create them. It creates and deletes
    pods only because PyTorchJobs run as v1 ran them (pods of their own, as the Training Operator's role allows);
    it never changes or execs into one."""
    grants = set()
    for obj in install_manifests():
        if obj["kind"] in ("ClusterRole", "Role"):
            grants |= {(res, verb) for rule in obj["rules"] for res in rule["resources"] for verb in rule["verbs"]}
    assert not {("trainjobs", "create"), ("pytorchjobs", "create"), ("pods", "patch"), ("pods", "update"),
                ("pods/exec", "create"), ("*", "*")} & grants
    cluster_role = next(o for o in install_manifests() if o["kind"] == "ClusterRole")
    secret_verbs = {v for r in cluster_role["rules"] if "secrets" in r["resources"] for v in r["verbs"]}
    assert secret_verbs <= {"create"}, "in job namespaces it creates MPI key Secrets; it reads only its own"


def test_deploy_directory_is_what_the_code_generates() -> None:
    on_disk = {str(p.relative_to(REPO / "deploy")): p.read_text() for p in (REPO / "deploy").rglob("*.yaml")}
    assert on_disk == deploy_files(), "deploy/ is stale: run `trainjob install --write deploy/`"


def test_install_dry_run_prints_every_manifest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install", "--dry-run"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == install_manifests()


def test_install_applies_to_a_real_cluster_and_is_repeatable(
    k8s: TrainJobCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API server accepts every manifest (CRDs, RBAC, the Deployment, the runtimes), twice."""
    args = k8s.install_args  # as the cluster was installed: the runtimes keep the training image
    try:
        assert main(args) == 0
        first = capsys.readouterr().out
        assert main(args) == 0
        second = capsys.readouterr().out
    finally:
        k8s.mount_shared_folders_in_runtimes()  # what the install just replaced, for the tests after this one
    assert "configured CustomResourceDefinition trainjobs.trainer.kubeflow.org" in first  # the fixture installed it
    assert "configured Deployment trainjob-operator" in first
    create_only = [o for o in install_manifests() if (o["metadata"].get("annotations") or {}).get(CREATE_ONLY_ANNOTATION)]
    assert "created ConfigMap kubeflow-trainer-public" in first or "kept ConfigMap kubeflow-trainer-public" in first
    assert second.count("configured") == len(install_manifests()) - len(create_only)
    assert second.count("kept") == len(create_only) == 4  # kubeflow-system, its version ConfigMap, Role, binding


def test_torch_image_replaces_the_torch_runtimes_image_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install", "--dry-run", "--torch-image", "registry.example/trainjob-train:0.1.0"]) == 0
    runtimes = {o["metadata"]["name"]: o for o in yaml.safe_load_all(capsys.readouterr().out)
                if o and o["kind"] == "ClusterTrainingRuntime"}

    def images(name: str) -> set[str]:
        jobs = runtimes[name]["spec"]["template"]["spec"]["replicatedJobs"]
        return {c["image"] for rj in jobs for c in rj["template"]["spec"]["template"]["spec"]["containers"]}

    assert images("torch-distributed") == images("torch-distributed-volcano") == {"registry.example/trainjob-train:0.1.0"}
    assert "registry.example/trainjob-train:0.1.0" not in images("mpi-distributed") | images("ray-distributed")


def test_the_operator_can_be_placed_on_the_clusters_system_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install", "--dry-run", "--operator-node-selector", "node-role.kubernetes.io/system=true",
                 "--operator-toleration", "node-role.kubernetes.io/system:NoSchedule",
                 "--operator-priority-class", "system-cluster-critical", "--operator-cpu", "250m"]) == 0
    deployment = next(o for o in yaml.safe_load_all(capsys.readouterr().out) if o and o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/system": "true"}
    assert pod["tolerations"] == [{"key": "node-role.kubernetes.io/system", "operator": "Exists",
                                   "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["containers"][0]["resources"]["requests"]["cpu"] == "250m"


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--operator-toleration", "no-effect", "--operator-toleration: expected KEY[=VALUE]:EFFECT"),
    ("--operator-node-selector", "no-value", "--operator-node-selector: expected NAME=VALUE, got 'no-value'"),
    ("--operator-priority-class", " ", "--operator-priority-class: must name a PriorityClass"),
])
def test_a_bad_operator_placement_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str], flag: str,
                                                             value: str, said: str) -> None:
    assert main(["install", "--dry-run", flag, value]) != 0
    captured = capsys.readouterr()
    assert said in captured.err and captured.out == ""
