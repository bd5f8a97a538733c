"""NCCL profiles (annotation and ``apply_nccl_profile``) and the three NCCL findings of ``trainjob check``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from trainjob.api import ClusterTrainingRuntime, TrainJob
from trainjob.cli.main import main
from trainjob.errors import NotFoundError, ValidationError
from trainjob.runtime import builtin_runtimes, resolve
from trainjob.runtime.nccl import PROFILES, apply_nccl_profile, nccl_findings, profile_env
from trainjob.runtime.submit_events import SubmitEvent, submit_events
from trainjob.runtime.template import pod_sets_from_runtime, trainer_pod_set
from trainjob.runtime.trainer_spec import apply_trainer
from trainjob.tools.checker import check_file

SHM_VOLUME = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
SHM_MOUNT = {"name": "shm", "mountPath": "/dev/shm"}


def trainjob(*, env: dict[str, str] | None = None, resources: dict[str, Any] | None = None,
             annotations: dict[str, str] | None = None, runtime: str = "torch-distributed") -> TrainJob:
    trainer: dict[str, Any] = {"numNodes": 2, "command": ["torchrun", "train.py"]}
    if env:
        trainer["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if resources:
        trainer["resourcesPerNode"] = {"limits": resources}
    return TrainJob.from_dict({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "j", **({"annotations": annotations} if annotations else {})},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer},
    })


def shm_runtime(mount: dict[str, Any] = SHM_MOUNT, volume: dict[str, Any] = SHM_VOLUME) -> ClusterTrainingRuntime:
    runtime = builtin_runtimes()["torch-distributed"].to_dict()
    runtime["metadata"]["name"] = "with-shm"
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["volumeMounts"] = [mount]
    pod["volumes"] = [volume]
    return ClusterTrainingRuntime.from_dict(runtime)


def findings(job: TrainJob, runtime: ClusterTrainingRuntime | None = None) -> list[str]:
    runtime = runtime or builtin_runtimes()[job.spec.runtime_ref.name]
    return [f.rule for f in nccl_findings(resolve(job, runtime))]


# -- the three findings -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("env", "resources", "runtime", "expected"),
    [
        ({"NCCL_DEBUG": "INFO"}, None, None, ["TJ015"]),  # NCCL on a CPU-only (gloo) job
        ({"NCCL_DEBUG": "INFO"}, {"nvidia.com/gpu": 1}, None, []),
        ({"OMP_NUM_THREADS": "1"}, None, None, []),
        ({"NCCL_IB_DISABLE": "1"}, {"nvidia.com/gpu": 1, "rdma/hca": 1}, None, ["TJ016"]),
        ({"NCCL_IB_DISABLE": "1"}, {"nvidia.com/gpu": 1, "mellanox.com/hca_shared": 1}, None, ["TJ016"]),
        ({"NCCL_IB_DISABLE": "0"}, {"nvidia.com/gpu": 1, "rdma/hca": 1}, None, []),
        ({"NCCL_IB_DISABLE": "1"}, {"nvidia.com/gpu": 1}, None, []),
        (None, {"nvidia.com/gpu": 4}, None, ["TJ017"]),  # several GPUs a node and no /dev/shm
        (None, {"nvidia.com/gpu": 4}, "shm", []),
        (None, {"nvidia.com/gpu": 4}, "disk-shm", ["TJ017"]),  # an emptyDir on disk is no memory-backed /dev/shm
        (None, {"nvidia.com/gpu": 1}, None, []),
    ],
)
def test_nccl_findings(env, resources, runtime, expected):
    runtimes = {None: None, "shm": shm_runtime(), "disk-shm": shm_runtime(volume={"name": "shm", "emptyDir": {}})}
    chosen = runtimes[runtime]
    job = trainjob(env=env, resources=resources, runtime=chosen.name if chosen else "torch-distributed")
    assert findings(job, chosen) == expected


def write(tmp_path: Path, documents: list[dict[str, Any]], name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


def test_check_file_reports_each_finding_at_its_line_with_what_to_do(tmp_path):
    path = write(tmp_path, [
        trainjob(env={"NCCL_SOCKET_IFNAME": "eth0"}).to_dict(),
        trainjob(env={"NCCL_IB_DISABLE": "1"}, resources={"nvidia.com/gpu": 8, "rdma/hca": 1}).to_dict(),
    ])
    lines = path.read_text().splitlines()
    found = {f.rule: f for f in check_file(path)}
    assert sorted(found) == ["TJ015", "TJ016", "TJ017"]
    assert "NCCL_SOCKET_IFNAME" in lines[found["TJ015"].line - 1]
    assert "NCCL_IB_DISABLE" in lines[found["TJ016"].line - 1] and found["TJ016"].line > found["TJ015"].line
    assert "nvidia.com/gpu" in lines[found["TJ017"].line - 1]
    assert found["TJ017"].severity == "error" and "mount it at /dev/shm" in found["TJ017"].fix
    assert "requests no GPU" in found["TJ015"].message and "drop the NCCL_* variables" in found["TJ015"].fix
    assert "NCCL_IB_DISABLE=0" in found["TJ016"].fix
    assert [f.rule for f in check_file(path, frozenset({"TJ017", "nccl-env-on-cpu-job"}))] == ["TJ016"]


def test_check_command_on_a_manifest_exits_1_on_the_dev_shm_error_and_0_on_warnings(tmp_path, capsys):
    multi_gpu = write(tmp_path, [trainjob(resources={"nvidia.com/gpu": 2}).to_dict()], "gpu.yaml")
    cpu = write(tmp_path, [trainjob(env={"NCCL_DEBUG": "INFO"}).to_dict()], "cpu.yaml")
    assert main(["check", str(multi_gpu)]) == 1
    assert "error TJ017 no-dev-shm-on-multi-gpu: TrainJob j: 2 GPUs per node" in capsys.readouterr().out
    assert main(["check", str(cpu)]) == 0
    out = capsys.readouterr().out
    assert "warning TJ015 nccl-env-on-cpu-job" in out
    assert out.splitlines()[-1] == "1 manifest checked: 0 errors, 1 warning, 0 hints"


def test_check_file_refuses_a_manifest_whose_runtime_is_unknown(tmp_path):
    path = write(tmp_path, [trainjob(runtime="nope").to_dict()])
    with pytest.raises(NotFoundError, match="'nope' not found"):
        check_file(path)


def test_submit_events_name_the_conversion_and_the_findings():
    job = trainjob(env={"NCCL_DEBUG": "INFO"}, annotations={
        "trainjob/converted-from": "kubeflow.org/v1 PyTorchJob", "trainjob/conversion-warnings": "a: b\nc: d"})
    events = submit_events(job, resolve(job, builtin_runtimes()["torch-distributed"]))
    assert events[:3] == [SubmitEvent("Converted", "converted from kubeflow.org/v1 PyTorchJob j"),
                          SubmitEvent("ConversionWarning", "a: b", "Warning"),
                          SubmitEvent("ConversionWarning", "c: d", "Warning")]
    assert events[3].reason == "NcclSetup" and events[3].message.startswith("TJ015 nccl-env-on-cpu-job: ")
    assert len(events) == 4


# -- profiles -----------------------------------------------------------------------------------------------------

def test_profiles_carry_the_seeds_variables():
    assert PROFILES["ib"]["NCCL_IB_DISABLE"] == "0" and PROFILES["ib"]["NCCL_NET_GDR_LEVEL"] == "5"
    assert PROFILES["ib"]["NCCL_IB_HCA"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert PROFILES["roce"]["NCCL_IB_GID_INDEX"] == "3" and PROFILES["roce"]["NCCL_IB_TC"] == "106"
    assert PROFILES["tcp"]["NCCL_IB_DISABLE"] == "1" and PROFILES["tcp"]["NCCL_SOCKET_IFNAME"] == "eth0"
    assert PROFILES["debug"] == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ALL"}
    assert profile_env("roce,debug")["NCCL_DEBUG"] == "INFO"  # later profiles win


def test_annotation_puts_the_profile_into_the_trainer_env_at_resolve_and_explicit_values_win():
    job = trainjob(env={"NCCL_SOCKET_IFNAME": "ib0"}, resources={"nvidia.com/gpu": 1},
                   annotations={"trainjob/nccl-profile": "roce"})
    env = resolve(job, builtin_runtimes()["torch-distributed"]).trainer().container().env_dict()
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert {k: env[k] for k in PROFILES["roce"] if k != "NCCL_SOCKET_IFNAME"} == {
        k: v for k, v in PROFILES["roce"].items() if k != "NCCL_SOCKET_IFNAME"}


def test_a_runtime_annotation_applies_when_the_job_has_none():
    runtime = builtin_runtimes()["torch-distributed"]
    runtime.metadata.annotations = {"trainjob/nccl-profile": "tcp"}
    pod_set = trainer_pod_set(pod_sets_from_runtime(runtime), runtime.name)
    apply_trainer(trainjob(), pod_set, runtime)
    assert pod_set.container().env_dict()["NCCL_IB_DISABLE"] == "1"
    pod_set = trainer_pod_set(pod_sets_from_runtime(runtime), runtime.name)
    apply_trainer(trainjob(annotations={"trainjob/nccl-profile": "debug"}), pod_set, runtime)
    assert "NCCL_IB_DISABLE" not in pod_set.container().env_dict()  # the job's profile, not the runtime's


def test_apply_nccl_profile_writes_the_env_into_the_trainjob():
    job = apply_nccl_profile(trainjob(env={"NCCL_DEBUG": "TRACE"}), "debug")
    assert job.metadata.annotations["trainjob/nccl-profile"] == "debug"
    assert [(e.name, e.value) for e in job.spec.trainer.env] == [("NCCL_DEBUG", "TRACE"),
                                                                 ("NCCL_DEBUG_SUBSYS", "ALL")]


@pytest.mark.parametrize("value", ["infiniband", "", "tcp,nope"])
def test_an_unknown_profile_is_refused_naming_the_known_ones(value):
    with pytest.raises(ValidationError, match=r"--nccl-profile: unknown NCCL profile .*profiles: debug, ib, roce, tcp"):
        apply_nccl_profile(trainjob(), value)
    job = trainjob(annotations={"trainjob/nccl-profile": value or ","})
    with pytest.raises(ValidationError, match=r"metadata.annotations\[trainjob/nccl-profile\]: unknown NCCL profile"):
        resolve(job, builtin_runtimes()["torch-distributed"])
