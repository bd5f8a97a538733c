"""MPI runtimes (Kubeflow v2.1 semantics): JobSet, SSH keys Secret and hostfile ConfigMap compared with golden files
and checked against the JobSet CRD and Kubernetes' schemas; the plugin's rules as tables; bad input.

Inputs are tests/runtime/mpi_cases/*.yaml. The generated key pair differs on every render: the golden files hold
``<generated>`` in its place, and the keys are checked to be a matching Ed25519 pair instead."""

from __future__ import annotations

import base64
import copy
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from kubetest.schemas import kubernetes_problems

from trainjob.api import TrainJob, dump_yaml, load_resources
from trainjob.errors import ValidationError
from trainjob.runtime import builtin_runtimes, find_runtime, resolve
from trainjob.runtime.render import render_objects

HERE = Path(__file__).resolve().parent
CASES = sorted((HERE / "mpi_cases").glob("*.yaml"))


def _render(path: Path) -> list[dict]:
    resources = load_resources(path)
    runtimes = [r for r in resources if not isinstance(r, TrainJob)]
    (job,) = [r for r in resources if isinstance(r, TrainJob)]
    return render_objects(resolve(job, find_runtime(job.spec.runtime_ref, runtimes, namespace=job.namespace)))


RENDERED = {f"mpi-{case.stem}": _render(case) for case in CASES}


def _with_keys_hidden(objects: list[dict]) -> list[dict]:
    out = copy.deepcopy(objects)
    for obj in out:
        if obj["kind"] == "Secret":
            obj["data"] = dict.fromkeys(obj["data"], "<generated>")
    return out


def _by_kind(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def _pod(jobset: dict, name: str) -> dict:
    job = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == name)
    return job["template"]["spec"]["template"]["spec"]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_rendered_mpi_objects_match_the_golden_file(name, golden):
    golden(name, dump_yaml(_with_keys_hidden(RENDERED[name])))


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_rendered_mpi_objects_fit_the_schemas(name, jobset_errors, kubernetes_job_errors):
    objects = RENDERED[name]
    jobset = objects[0]
    assert jobset_errors(jobset) == []
    for replicated in jobset["spec"]["replicatedJobs"]:
        assert kubernetes_job_errors(replicated, f"{name}-{replicated['name']}") == []
    assert kubernetes_problems(_by_kind(objects, "Secret")) == []
    assert kubernetes_problems(_by_kind(objects, "ConfigMap")) == []


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_the_secret_holds_a_fresh_matching_ssh_key_pair(name):
    secret = _by_kind(RENDERED[name], "Secret")
    assert (secret["type"], secret["immutable"]) == ("kubernetes.io/ssh-auth", True)
    private = serialization.load_ssh_private_key(base64.b64decode(secret["data"]["ssh-privatekey"]), password=None)
    public_line = base64.b64decode(secret["data"]["ssh-publickey"]).decode()
    derived = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert public_line == derived.decode() + "\n"
    assert public_line.startswith("ssh-ed25519 ")
    again = _by_kind(_render(HERE / "mpi_cases" / f"{name.removeprefix('mpi-')}.yaml"), "Secret")
    assert again["data"]["ssh-privatekey"] != secret["data"]["ssh-privatekey"], "every job gets its own keys"


def test_the_hostfile_lists_every_node_pod_with_its_slots_and_is_mounted_on_the_launcher():
    objects = RENDERED["mpi-mpi-distributed"]
    jobset, config_map = objects[0], _by_kind(objects, "ConfigMap")
    assert config_map["metadata"]["name"] == "pi-mpi-hostfile"
    assert config_map["data"]["hostfile"] == "pi-node-0-0.pi slots=2\npi-node-0-1.pi slots=2\n"
    # The host names are the pods' DNS names: {jobset}-{replicatedJob}-{jobIndex}-{podIndex}.{subdomain}.
    assert jobset["spec"]["network"]["subdomain"] == "pi"
    launcher = _pod(jobset, "launcher")
    assert {v["name"] for v in launcher["volumes"]} == {"mpi-ssh-auth", "mpi-hostfile"}
    mounts = {m["name"]: m["mountPath"] for m in launcher["containers"][0]["volumeMounts"]}
    assert mounts == {"mpi-ssh-auth": "/home/mpiuser/.ssh", "mpi-hostfile": "/etc/mpi"}
    assert _env(launcher["containers"][0]) == {
        "LOG_LEVEL": "debug",
        "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_set_default_slots": "2",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
    }
    node = _pod(jobset, "node")
    assert [v["name"] for v in node["volumes"]] == ["mpi-ssh-auth"]
    assert node["containers"][0]["command"] == ["/usr/sbin/sshd"], "the TrainJob's command runs on the launcher"
    assert "env" not in node["containers"][0], "without runLauncherAsNode the node pods keep the runtime's env"


def test_run_launcher_as_node_puts_the_launcher_first_in_the_hostfile_and_trains_on_the_nodes():
    objects = RENDERED["mpi-deepspeed-distributed"]
    assert _by_kind(objects, "ConfigMap")["data"]["hostfile"] == (
        "llm-launcher-0-0.llm slots=2\nllm-node-0-0.llm slots=2\nllm-node-0-1.llm slots=2\n"
    )
    jobset = objects[0]
    node_job = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == "node")
    assert node_job["template"]["spec"]["parallelism"] == 2, "3 nodes: the launcher and 2 node pods"
    node = _pod(jobset, "node")["containers"][0]
    assert node["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert _env(node) == {"NCCL_DEBUG": "INFO"}


def test_gang_scheduling_counts_the_launcher_and_every_node_pod():
    objects = RENDERED["mpi-custom-mpi-coscheduling"]
    pod_group = _by_kind(objects, "PodGroup")
    assert pod_group["spec"]["minMember"] == 4
    assert pod_group["spec"]["minResources"] == {"cpu": "12"}
    assert [o["kind"] for o in objects] == ["JobSet", "PodGroup", "Secret", "ConfigMap"]
    assert all(o["metadata"]["namespace"] == "hpc" for o in objects)


@pytest.mark.parametrize(
    ("runtime", "trainer", "hosts", "slots"),
    [
        # numNodes from the runtime (1); runLauncherAsNode keeps at least one node pod (Kubeflow's max(n-1, 1))
        ("deepspeed-distributed", {}, ["j-launcher-0-0.j", "j-node-0-0.j"], 1),
        ("deepspeed-distributed", {"numNodes": 1}, ["j-launcher-0-0.j", "j-node-0-0.j"], 1),
        ("deepspeed-distributed", {"numNodes": 2, "numProcPerNode": 8}, ["j-launcher-0-0.j", "j-node-0-0.j"], 8),
        ("mpi-distributed", {}, ["j-node-0-0.j"], 1),
        ("mpi-distributed", {"numNodes": 3}, ["j-node-0-0.j", "j-node-0-1.j", "j-node-0-2.j"], 1),
        # the runtime's 1 slot becomes the GPU count when a node has more than one GPU; an explicit value wins
        ("mpi-distributed", {"resourcesPerNode": {"limits": {"nvidia.com/gpu": "4"}}}, ["j-node-0-0.j"], 4),
        ("mpi-distributed", {"numProcPerNode": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "4"}}},
         ["j-node-0-0.j"], 2),
    ],
)
def test_hosts_and_slots(make_job, runtime, trainer, hosts, slots):
    plan = resolve(make_job(runtime=runtime, name="j", **trainer), builtin_runtimes()[runtime])
    assert (plan.ml_policy, plan.mpi.hosts, plan.mpi.slots) == ("mpi", hosts, slots)
    assert (plan.num_nodes, plan.num_proc_per_node) == (len(hosts), slots)
    assert plan.plugins == ["mpi", "jobset"]


def test_ssh_keys_mount_at_the_default_path_when_the_runtime_names_none(make_job, make_runtime):
    launcher = {
        "name": "launcher",
        "template": {"spec": {"template": {"spec": {"containers": [{"name": "node", "image": "mpi:1"}]}}}},
    }
    runtime = make_runtime(mlPolicy={"mpi": {}}, jobs=[launcher])
    plan = resolve(make_job(runtime="rt"), runtime)
    assert plan.mpi.ssh_auth_mount_path == "/root/.ssh"
    assert plan.mpi.implementation == "OpenMPI"
    jobset = render_objects(plan)[0]
    for job in ("launcher", "node"):
        mounts = _pod(jobset, job)["containers"][0]["volumeMounts"]
        assert {"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"} in mounts


# bad input


def test_an_unknown_mpi_implementation_is_refused_naming_the_supported_one():
    text = (HERE / "mpi_cases" / "custom-mpi-coscheduling.yaml").read_text()
    with pytest.raises(ValidationError, match=r"spec.mlPolicy.mpi.mpiImplementation: must be 'OpenMPI' or '', "
                                              r"got 'MPICH'"):
        load_resources(text.replace("numProcPerNode: 4", "numProcPerNode: 4\n      mpiImplementation: MPICH"))


def test_the_plugin_refuses_an_implementation_it_cannot_render_even_past_the_api(make_job, make_runtime):
    runtime = make_runtime(mlPolicy={"mpi": {}}, jobs=[_launcher_job()])
    object.__setattr__(runtime.spec.ml_policy.mpi, "mpi_implementation", "IntelMPI")
    with pytest.raises(ValidationError) as raised:
        resolve(make_job(runtime="rt"), runtime)
    assert str(raised.value) == (
        "spec.mlPolicy.mpi.mpiImplementation: 'IntelMPI' is not supported; supported: OpenMPI"
    )


def test_a_runtime_without_a_launcher_job_is_refused(make_job, make_runtime):
    with pytest.raises(ValidationError) as raised:
        resolve(make_job(runtime="rt"), make_runtime(mlPolicy={"mpi": {"numProcPerNode": 2}}))
    assert str(raised.value) == (
        "spec.template.spec.replicatedJobs: runtime 'rt' has mlPolicy.mpi but no 'launcher' job; an MPI runtime "
        "needs a 'launcher' job (runs mpirun) and a 'node' job (the hosts), it has: node"
    )


@pytest.mark.parametrize("setting", ["auto", "gpu"])
def test_num_proc_per_node_must_be_a_slot_count(make_job, setting):
    with pytest.raises(ValidationError) as raised:
        resolve(make_job(runtime="mpi-distributed", numProcPerNode=setting), builtin_runtimes()["mpi-distributed"])
    assert str(raised.value) == (
        "spec.trainer.numProcPerNode: must be an integer for MPI runtime 'mpi-distributed' (the hostfile's slots "
        f"per node), got {setting!r}"
    )


def _launcher_job() -> dict:
    return {
        "name": "launcher",
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "mpi:1"}]}}},
        },
    }
