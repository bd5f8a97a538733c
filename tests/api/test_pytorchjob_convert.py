"""Kubeflow v1 PyTorchJobs become TrainJobs (+ TrainingRuntimes): the seeds' four, each mapped field, bad input."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainjob import convert
from trainjob.api import TrainingRuntime, TrainJob, dump_yaml, load_resources, read_documents
from trainjob.api.schema import crd_validator
from trainjob.backends.ttl import TTL_ANNOTATION
from trainjob.convert import (
    CONVERSION_WARNINGS_ANNOTATION,
    CONVERTED_FROM_ANNOTATION,
    conversion_warnings,
    convert_pytorchjob,
    converted_from,
)
from trainjob.errors import ValidationError
from trainjob.runtime import find_runtime, resolve
from trainjob.runtime.render import render_objects

HERE = Path(__file__).resolve().parent
SEEDS = HERE.parents[1] / ".." / "shared" / "seeds"
COPIES = HERE / "seed_manifests"
SEED_FILES = {p.stem: p for p in sorted(COPIES.glob("*.yml"))}


def seed(name: str) -> dict[str, Any]:
    (document,) = read_documents(SEED_FILES[name])
    return document


def job(*, master: dict | None = None, worker: dict | None = None, **spec: Any) -> dict[str, Any]:
    """A PyTorchJob dict; ``master``/``worker`` are replica specs, their container is ``pytorch``."""
    replicas = {}
    for kind, replica in (("Master", master), ("Worker", worker)):
        if replica is not None:
            replica = copy.deepcopy(replica)
            container = {"name": "pytorch", "image": "img", "command": ["torchrun", "train.py"],
                         **replica.pop("container", {})}
            pod = {"containers": [container], **replica.pop("pod", {})}
            replicas[kind] = {"template": {"spec": pod}, **replica}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt", "namespace": "ml"},
            "spec": {"pytorchReplicaSpecs": replicas, **spec}}


# -- the seeds ----------------------------------------------------------------------------------------------------

def test_the_copies_are_the_pytorchjobs_of_seeds_002_to_004():
    found = {p.name[:3]: p for p in sorted(SEEDS.glob("00[234]_*.txt"))}
    if len(found) < 3:
        pytest.skip(f"seeds 002-004 not found under {SEEDS}")
    for name, path in SEED_FILES.items():
        text = found[name[:3]].read_text(encoding="utf-8")
        assert path.read_text(encoding="utf-8").strip() in text, name
    assert sum(t.read_text(encoding="utf-8").count("kind: PyTorchJob") for t in found.values()) == len(SEED_FILES) == 4


SEED_EXPECTED = {
    # name: (TrainJob name, namespace, numNodes, numProcPerNode, elastic (min, max), command)
    "002-0": ("llm-training", "ml-workloads", 4, 8, None,
              ["python", "-m", "torch.distributed.run", "train.py", "--config=config/llm.yaml"]),
    "003-0": ("ddp-training", "ai-training", 4, 8, None, ["torchrun", "train.py"]),
    "004-0": ("pytorch-ddp-single-node", "default", 1, 4, None,
              ["python", "-m", "torch.distributed.run", "train.py", "--epochs=10", "--batch-size=256"]),
    "004-1": ("pytorch-ddp-multi-node", "default", 4, 1, (1, 4),
              ["torchrun", "train.py", "--epochs=100", "--batch-size=1024"]),
}


@pytest.mark.parametrize("name", sorted(SEED_EXPECTED))
def test_seed_pytorchjob_converts_to_the_same_nodes_processes_and_command(name):
    job_name, namespace, nodes, nproc, elastic, command = SEED_EXPECTED[name]
    conversion = convert_pytorchjob(seed(name))
    trainjob, runtime = conversion.trainjob, conversion.runtime
    assert (trainjob.name, trainjob.namespace) == (job_name, namespace)
    assert trainjob.spec.trainer.command == command
    assert trainjob.metadata.annotations[CONVERTED_FROM_ANNOTATION] == "kubeflow.org/v1 PyTorchJob"
    assert runtime is not None and runtime.metadata.namespace == namespace  # volumes need the runtime
    assert trainjob.spec.runtime_ref.kind == "TrainingRuntime" and trainjob.spec.runtime_ref.name == runtime.name
    plan = resolve(trainjob, runtime)
    assert (plan.num_nodes, plan.num_proc_per_node) == (nodes, nproc)
    assert (plan.elastic.min_nodes, plan.elastic.max_nodes) == elastic if elastic else plan.elastic is None
    assert plan.jobset_spec["failurePolicy"] == {"maxRestarts": 6}  # restartPolicy: OnFailure


@pytest.fixture(scope="module")
def jobset_errors():
    from kubetest.reference import reference_file

    try:
        crd = reference_file("jobset", "jobset.x-k8s.io_jobsets.yaml")
    except LookupError as exc:
        pytest.skip(str(exc))
    return crd_validator(crd, version="v1alpha2")


@pytest.mark.parametrize("name", sorted(SEED_EXPECTED))
def test_seed_conversion_fits_the_kubeflow_crds_and_renders_a_valid_jobset(name, crd_errors, jobset_errors):
    conversion = convert_pytorchjob(seed(name))
    for resource in conversion.resources:
        assert crd_errors(resource.to_dict()) == [], resource.kind
    (again,) = [r for r in load_resources(dump_yaml(conversion.resources)) if isinstance(r, TrainJob)]
    assert again == conversion.trainjob
    objects = render_objects(resolve(conversion.trainjob, conversion.runtime))
    jobset = objects[0]
    assert jobset["kind"] == "JobSet" and jobset_errors(jobset) == []
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    original = seed(name)["spec"]["pytorchReplicaSpecs"]
    template = (original.get("Master") or original["Worker"])["template"]["spec"]
    assert pod["volumes"] == template["volumes"]
    (node,) = pod["containers"]
    assert node["volumeMounts"] == template["containers"][0]["volumeMounts"]
    assert node["resources"]["limits"] == {k: str(v) for k, v in template["containers"][0]["resources"]["limits"].items()}
    assert {e["name"]: e.get("value") for e in node["env"]}.items() >= {
        e["name"]: e["value"] for e in template["containers"][0].get("env", [])}.items()


def test_seed_002_master_and_worker_differences_are_named_in_a_warning():
    conversion = convert_pytorchjob(seed("002-0"))
    (warning,) = [w for w in conversion.warnings if "differ" in w]
    for field in ("containers[pytorch].env", "volumes[dataset].persistentVolumeClaim.readOnly", "spec.affinity"):
        assert field in warning
    assert conversion_warnings(conversion.trainjob.metadata.annotations) == conversion.warnings


def test_convert_load_resources_converts_a_pytorchjob_among_other_documents():
    text = SEED_FILES["004-0"].read_text() + "\n---\n" + (
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: plain}\n"
        "spec: {runtimeRef: {name: torch-distributed}}\n")
    kinds = [(r.kind, r.name) for r in convert.load_resources(text)]
    assert kinds == [("TrainingRuntime", "pytorch-ddp-single-node"), ("TrainJob", "pytorch-ddp-single-node"),
                     ("TrainJob", "plain")]
    with pytest.raises(ValidationError, match="got 'PyTorchJob'.*trainjob.convert.load_resources"):
        load_resources(SEED_FILES["004-0"].read_text())  # the API's own loader reads v1alpha1 resources only


# -- each field ---------------------------------------------------------------------------------------------------

def test_master_is_node_0_and_workers_add_nodes():
    assert convert_pytorchjob(job(master={}, worker={"replicas": 3})).trainjob.spec.trainer.num_nodes == 4
    assert convert_pytorchjob(job(master={})).trainjob.spec.trainer.num_nodes == 1
    assert convert_pytorchjob(job(worker={"replicas": 2})).trainjob.spec.trainer.num_nodes == 2
    assert convert_pytorchjob(job(master={}, worker={})).trainjob.spec.trainer.num_nodes == 2  # replicas default 1
    assert convert_pytorchjob(job(master={}, worker={"replicas": 0})).trainjob.spec.trainer.num_nodes == 1


@pytest.mark.parametrize(
    ("command", "spec_nproc", "expected"),
    [
        (["torchrun", "--nproc_per_node=4", "t.py"], None, 4),
        (["torchrun", "--nproc-per-node", "2", "t.py"], None, 2),
        (["python", "-m", "torch.distributed.launch", "--nproc_per_node=gpu", "t.py"], None, "gpu"),
        (["torchrun", "t.py"], "3", 3),
        (["torchrun", "t.py"], "cpu", "cpu"),
        (["torchrun", "t.py"], None, None),  # the runtime's default (auto)
        (["python", "t.py"], None, 1),  # v1 ran the script directly: one process per pod
        (["torchrun", "--nproc_per_node=2", "t.py"], "8", 2),  # the command wins, as with torchrun
    ],
)
def test_processes_per_node_come_from_the_command_or_nproc_per_node(command, spec_nproc, expected):
    spec = {"nprocPerNode": spec_nproc} if spec_nproc else {}
    conversion = convert_pytorchjob(job(master={"container": {"command": command}}, **spec))
    assert conversion.trainjob.spec.trainer.num_proc_per_node == expected
    assert any("command's value is used" in w for w in conversion.warnings) == (spec_nproc == "8")


def test_elastic_policy_becomes_the_runtime_torch_elastic_policy():
    conversion = convert_pytorchjob(job(worker={"replicas": 3}, elasticPolicy={
        "rdzvBackend": "etcd", "minReplicas": 2, "maxReplicas": 3, "maxRestarts": 5, "rdzvPort": 1234}))
    elastic = conversion.runtime.spec.ml_policy.torch.elastic_policy
    assert (elastic.min_nodes, elastic.max_nodes, elastic.max_restarts) == (2, 3, 5)
    assert conversion.trainjob.spec.trainer.num_nodes is None  # the elastic range decides
    assert any("rdzvBackend: 'etcd' is replaced by c10d" in w for w in conversion.warnings)
    assert any("rdzvPort" in w for w in conversion.warnings)
    plan = resolve(conversion.trainjob, conversion.runtime)
    assert plan.trainer().container().env_dict()["PET_NNODES"] == "2:3"
    assert plan.trainer().container().env_dict()["PET_MAX_RESTARTS"] == "5"


@pytest.mark.parametrize(
    ("restart_policy", "run_policy", "failure_policy"),
    [
        ("OnFailure", {}, {"maxRestarts": 6}),
        ("OnFailure", {"backoffLimit": 2}, {"maxRestarts": 2}),
        ("Never", {"backoffLimit": 1}, {"maxRestarts": 1}),
        ("Never", {}, None),
        (None, {}, None),
    ],
)
def test_restart_policy_and_backoff_limit_become_jobset_restarts(restart_policy, run_policy, failure_policy):
    replica = {"restartPolicy": restart_policy} if restart_policy else {}
    conversion = convert_pytorchjob(job(master=replica, runPolicy=run_policy))
    if failure_policy is None:
        assert conversion.runtime is None  # nothing a built-in runtime cannot do
        assert conversion.trainjob.spec.runtime_ref.name == "torch-distributed"
    else:
        assert conversion.runtime.spec.template.spec.failure_policy == failure_policy


def test_run_policy_fields_map_to_the_trainjob_or_a_warning():
    conversion = convert_pytorchjob(job(master={}, runPolicy={
        "activeDeadlineSeconds": 3600, "ttlSecondsAfterFinished": 600, "suspend": True, "cleanPodPolicy": "All",
        "schedulingPolicy": {"queue": "q"}}))
    trainjob = conversion.trainjob
    assert trainjob.spec.active_deadline_seconds == 3600 and trainjob.spec.suspend is True
    assert trainjob.metadata.annotations[TTL_ANNOTATION] == "600"
    assert [w.split(":")[0] for w in conversion.warnings] == ["spec.runPolicy.cleanPodPolicy",
                                                               "spec.runPolicy.schedulingPolicy"]
    assert trainjob.metadata.annotations[CONVERSION_WARNINGS_ANNOTATION].splitlines() == conversion.warnings
    assert resolve(trainjob, find_runtime(trainjob.spec.runtime_ref)).suspend is True


def test_env_and_resources_go_to_the_trainer_and_pod_fields_to_the_runtime():
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    conversion = convert_pytorchjob(job(master={
        "container": {"env": [{"name": "A", "value": "1"}, {"name": "POD", "valueFrom": {"fieldRef": {
                          "fieldPath": "metadata.name"}}}],
                      "resources": {"limits": {"nvidia.com/gpu": 2}, "requests": {"cpu": "4", "memory": "8Gi"}},
                      "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                      "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}},
        "pod": {"tolerations": [toleration], "nodeSelector": {"gpu": "a100"},
                "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}}))
    trainer = conversion.trainjob.spec.trainer
    assert [e.to_dict() for e in trainer.env] == [{"name": "A", "value": "1"}, {"name": "POD", "valueFrom": {
        "fieldRef": {"fieldPath": "metadata.name"}}}]
    assert trainer.resources_per_node.to_dict() == {"limits": {"nvidia.com/gpu": 2},
                                                    "requests": {"cpu": "4", "memory": "8Gi"}}
    plan = resolve(conversion.trainjob, conversion.runtime)
    pod = render_objects(plan)[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["tolerations"] == [toleration] and pod["nodeSelector"] == {"gpu": "a100"}
    assert pod["containers"][0]["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": "4", "memory": "8Gi"}
    assert plan.trainer().container().env_dict(index=0)["A"] == "1"


def test_launcher_options_the_runtime_sets_are_taken_out_and_surprising_values_named():
    command = ["torchrun", "--nnodes=3", "--node_rank=$(RANK)", "--master_addr", "$(MASTER_ADDR)",
               "--master-port=23456", "--log-dir=/logs", "train.py", "--nnodes=7"]
    conversion = convert_pytorchjob(job(master={"container": {"command": command}}, worker={
        "container": {"command": command}}))
    assert conversion.trainjob.spec.trainer.command == ["torchrun", "--log-dir=/logs", "train.py", "--nnodes=7"]
    assert [re.sub(r".*command: ", "", w).split(" ")[0] for w in conversion.warnings] == [
        "--nnodes=3", "--master-port=23456"]


def test_a_pytorchjob_name_and_labels_stay_and_the_origin_is_recorded():
    data = job(master={})
    data["metadata"].update(labels={"team": "nlp"}, annotations={"owner": "me"})
    trainjob = convert_pytorchjob(data).trainjob
    assert trainjob.metadata.labels == {"team": "nlp"}
    assert trainjob.metadata.annotations["owner"] == "me"
    assert converted_from(trainjob.metadata.annotations) == "kubeflow.org/v1 PyTorchJob"
    assert converted_from({}) is None


def test_other_containers_and_pod_metadata_keep_the_runtime_and_the_trainer_is_renamed_node():
    conversion = convert_pytorchjob(job(master={"pod": {"containers": [
        {"name": "sidecar", "image": "busybox"},
        {"name": "pytorch", "image": "img", "command": ["python", "train.py"]}]}}))
    runtime = conversion.runtime
    assert isinstance(runtime, TrainingRuntime)
    pod = runtime.spec.template.spec.replicated_jobs[0].template["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["sidecar", "node"]
    plan = resolve(conversion.trainjob, runtime)
    assert plan.trainer().container("node").command == ["torchrun", "train.py"]


# -- bad input ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        (job(master={}) | {"spec": {"pytorchReplicaSpecs": {"Chief": {"template": {}}}}},
         "spec.pytorchReplicaSpecs", "unknown replica type 'Chief'; a PyTorchJob has Master (node 0) and Worker"),
        (job(), "spec.pytorchReplicaSpecs", "needs a Master or a Worker replica spec"),
        (job(master={"replicas": 2}), "spec.pytorchReplicaSpecs", "Master replicas must be 1 (the Master is node 0), "
         "got 2; put the other nodes under Worker"),
        (job(master={}, nprocPerNode="eight"), "spec.nprocPerNode", "must be auto, cpu, gpu or an integer >= 1, "
         "got 'eight'"),
        (job(master={}, nprocPerNode="0"), "spec.nprocPerNode", "must be auto, cpu, gpu or an integer >= 1"),
        (job(master={"container": {"command": ["torchrun", "--nproc_per_node=lots", "t.py"]}}),
         "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].command", "--nproc-per-node must be auto"),
        (job(worker={"replicas": 0}), "spec.pytorchReplicaSpecs.Worker.replicas", "must be >= 1 when there is no Master"),
        (job(master={"restartPolicy": "Sometimes"}), "spec.pytorchReplicaSpecs.Master.restartPolicy", "Always"),
        (job(master={}, elasticPolicy={"minReplicas": 3, "maxReplicas": 2}), "spec.elasticPolicy",
         "minReplicas (3) must be <= maxReplicas (2)"),
        (job(master={"pod": {"containers": [{"name": "pytorch", "ports": [{}]}]}}),
         "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].ports[0].containerPort", "required"),
        (job(master={}) | {"metadata": {"name": "Bad_Name"}}, "metadata.name", "must be a DNS subdomain"),
        (job(master={}) | {"metadata": {"name": "a.b"}}, "metadata.name", "must be a DNS label"),  # a TrainJob's
    ],
)
def test_bad_pytorchjob_is_refused_naming_the_field_and_what_is_accepted(data, path, message):
    with pytest.raises(ValidationError) as info:
        convert_pytorchjob(data)
    assert info.value.path == path
    assert message in info.value.message


def test_a_bad_pytorchjob_in_a_file_names_the_document():
    text = yaml.safe_dump_all([job(master={}), job(master={"replicas": 2})])
    with pytest.raises(ValidationError, match=r"documents\[1\]\.spec\.pytorchReplicaSpecs: Master replicas"):
        convert.load_resources(text)


@pytest.mark.parametrize("module", ["trainjob.convert.pytorchjob", "trainjob.convert.pytorchjob_api",
                                    "trainjob.convert.container_command"])
def test_the_docstring_examples_of_the_convert_modules_hold(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
