"""Pod-template volumes in the local backend: claims, emptyDirs, hostPaths and configMaps seen at their mountPath.

The tests run as root, so the ``namespace`` mechanism (a private mount namespace per node) is real here; the
``env`` fallback is forced with the backend setting. Every test checks that no mount outlived it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jobtest.local import delete_all_jobs, processes_under, trainjob_resource

from trainjob.backends.local import volumes
from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.errors import JobFailedError, NotFoundError, ValidationError

pytestmark = pytest.mark.skipif(volumes.namespace_problem() is not None,
                                reason=f"mount namespaces unavailable: {volumes.namespace_problem()}")

#: Each node's rank 0 writes its own file into the directory it is given (the claim at /output).
WRITER = """
    import json, os, sys
    out = sys.argv[1]
    if os.environ["LOCAL_RANK"] == "0":
        node = os.environ["GROUP_RANK"]
        with open(os.path.join(out, f"node-{node}.txt"), "w") as f:
            f.write(f"written by node {node} rank {os.environ['RANK']}")
    seen = {"path_map": os.environ.get("TRAINJOB_PATH_MAP"), "mount_env": os.environ.get("TRAINJOB_MOUNT_OUT"),
            "argv": sys.argv[1:]}
    with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], f"seen-{os.environ['RANK']}.json"), "w") as f:
        json.dump(seen, f)
"""

#: Copies what it finds under argv[1] into the job's directory.
READER = """
    import json, os, sys
    src = sys.argv[1]
    found = {name: open(os.path.join(src, name)).read() for name in sorted(os.listdir(src))}
    try:
        open(os.path.join(src, "not-allowed"), "w").close()
        found["write"] = "allowed"
    except OSError as exc:
        found["write"] = exc.strerror
    with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], "found.json"), "w") as f:
        json.dump(found, f)
"""


#: Where these tests mount things (their mountPaths, and their temp dirs); other tests running beside these may
#: add mounts elsewhere (network namespaces under /run/netns), which are not this file's to judge.
WATCHED = ("/output", "/input", "/scratch", "/dev/shm", "/cache", "/weights", "/etc/train", "/v", "/tmp")
#: The test cluster's nodes, which may run beside these tests (the cluster tier), mount their pods' sandboxes and
#: volumes under their own folders in the cluster session's temp dir: not this file's to judge either.
CLUSTER_NODE_FOLDER = re.compile(r"/nodes/tj\d+-")


def mounts() -> list[str]:
    """This process's mounts at or under :data:`WATCHED`, without mount ids (which the kernel reuses)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        lines = [line.split() for line in f]
    return sorted(" ".join(fields[3:]) for fields in lines
                  if any(fields[4] == path or fields[4].startswith(path + "/") for path in WATCHED)
                  and not CLUSTER_NODE_FOLDER.search(fields[4]))


@pytest.fixture
def no_new_mounts() -> Iterator[None]:
    before = mounts()
    yield
    assert mounts() == before, "a mount outlived its test"


@pytest.fixture
def volume_backend(trainjob_home: Path, tmp_path: Path, no_new_mounts: None) -> Iterator[Callable[..., LocalBackend]]:
    """``make(**config)``: a backend on this test's home whose claims live in the test's temp dir."""
    made: list[LocalBackend] = []

    def make(**config: Any) -> LocalBackend:
        config.setdefault("volumes_root", tmp_path / "claims")
        backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home, **config))
        made.append(backend)
        return backend

    yield make
    for backend in made:
        delete_all_jobs(backend)
    assert processes_under(trainjob_home) == []


def pod_volumes(volume_list: list[dict[str, Any]], mount_list: list[dict[str, Any]]) -> dict[str, Any]:
    """``spec`` extras mounting ``volume_list`` in the trainer container."""
    return {"podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {
        "volumes": volume_list, "containers": [{"name": "node", "volumeMounts": mount_list}]}}]}


def claim(name: str, claim_name: str, mount_path: str, read_only: bool = False) -> dict[str, Any]:
    return pod_volumes([{"name": name, "persistentVolumeClaim": {"claimName": claim_name}}],
                       [{"name": name, "mountPath": mount_path, **({"readOnly": True} if read_only else {})}])


def run_job(backend: LocalBackend, name: str, command: list[str], **trainer: Any) -> Path:
    backend.apply(trainjob_resource(name, command, **trainer))
    try:
        backend.wait_for_job_status(name, timeout=300)
    except Exception as exc:  # the nodes' output says why
        logs = "\n".join(str(line) for line in backend.logs(name))
        raise AssertionError(f"{name} did not complete: {exc}\n{logs}") from exc
    return backend.store.job_dir(name)


def event(backend: LocalBackend, name: str, reason: str) -> str:
    return next(e.message for e in backend.get_job_events(name) if e.reason == reason)


def test_two_nodes_write_into_a_claim_at_output_and_a_later_job_reads_both_files(local_jobs, volume_backend, script, tmp_path):
    backend = volume_backend(mount_mechanism="namespace")
    host_had_output = os.path.exists("/output")
    writer, reader = script("writer.py", WRITER), script("reader.py", READER)

    job_dir = run_job(backend, "writers", ["torchrun", writer], args=["/output"], num_nodes=2, num_proc_per_node=2,
                      spec=claim("out", "results", "/output"))

    claim_dir = tmp_path / "claims" / "default" / "results"
    assert sorted(os.listdir(claim_dir)) == ["node-0.txt", "node-1.txt"]
    assert (claim_dir / "node-1.txt").read_text() == "written by node 1 rank 2"
    seen = json.loads((job_dir / "seen-3.json").read_text())
    assert seen["argv"] == ["/output"], "the namespace mechanism leaves the command as the pod has it"
    assert json.loads(seen["path_map"]) == {"/output": "/output"} and seen["mount_env"] == "/output"
    message = event(backend, "writers", "VolumesMounted")
    assert message.startswith("namespace") and f"out (persistentVolumeClaim) -> {claim_dir} at /output" in message
    if not host_had_output:
        assert os.listdir("/output") == [], "the host sees an empty mount point, never the claim's files"

    job_dir = run_job(backend, "reader", ["python", reader], args=["/input"], spec=claim("in", "results", "/input",
                                                                                          read_only=True))

    found = json.loads((job_dir / "found.json").read_text())
    assert found == {"node-0.txt": "written by node 0 rank 0", "node-1.txt": "written by node 1 rank 2",
                     "write": "Read-only file system"}
    backend.delete_job("writers")
    backend.delete_job("reader")
    assert sorted(os.listdir(claim_dir)) == ["node-0.txt", "node-1.txt"], "deleting jobs never deletes a claim"
    assert os.path.exists("/output") == host_had_output, "the mount point the job made went with it"


def test_env_fallback_rewrites_mount_paths_so_two_nodes_share_the_claim(local_jobs, volume_backend, script, tmp_path):
    backend = volume_backend(mount_mechanism="env")
    writer, reader = script("writer.py", WRITER), script("reader.py", READER)

    job_dir = run_job(backend, "writers", ["torchrun", writer], args=["/output"], num_nodes=2, num_proc_per_node=1,
                      spec=claim("out", "results", "/output"))

    claim_dir = tmp_path / "claims" / "default" / "results"
    assert sorted(os.listdir(claim_dir)) == ["node-0.txt", "node-1.txt"]
    seen = json.loads((job_dir / "seen-1.json").read_text())
    assert seen["argv"] == [str(claim_dir)]
    assert json.loads(seen["path_map"]) == {"/output": str(claim_dir)} and seen["mount_env"] == str(claim_dir)
    assert event(backend, "writers", "VolumesMounted").startswith("env (paths rewritten")
    assert not os.path.exists("/output/node-0.txt")

    job_dir = run_job(backend, "reader", ["python", reader], args=["/input/"], spec=claim("in", "results", "/input"))

    found = json.loads((job_dir / "found.json").read_text())
    assert found["node-0.txt"] == "written by node 0 rank 0" and found["node-1.txt"] == "written by node 1 rank 1"


def test_empty_dir_is_per_node_and_goes_with_the_job(local_jobs, volume_backend, script):
    backend = volume_backend(mount_mechanism="namespace")
    probe = script("scratch.py", """
        import os
        node = os.environ["PET_NODE_RANK"]
        open(f"/scratch/from-node-{node}", "w").close()
        with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], f"listing-{node}"), "w") as f:
            f.write(",".join(sorted(os.listdir("/scratch"))))
    """)

    job_dir = run_job(backend, "scratchy", ["python", probe], num_nodes=2,
                      spec=pod_volumes([{"name": "scratch", "emptyDir": {}}], [{"name": "scratch", "mountPath": "/scratch"}]))

    assert [(job_dir / f"listing-{node}").read_text() for node in (0, 1)] == ["from-node-0", "from-node-1"]
    node_dirs = [job_dir / "volumes" / "emptyDir" / "scratch" / f"node-{node}" for node in (0, 1)]
    assert [sorted(os.listdir(d)) for d in node_dirs] == [["from-node-0"], ["from-node-1"]]
    backend.delete_job("scratchy")
    assert not any(d.exists() for d in node_dirs)


SHM_PROBE = """
    import os
    usage = os.statvfs("/dev/shm")
    with open("/dev/shm/trainjob-test-marker", "w") as f:
        f.write("x")
    with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], "shm"), "w") as f:
        f.write(str(usage.f_blocks * usage.f_frsize))
"""


def test_memory_empty_dir_at_dev_shm_is_a_tmpfs_of_its_size_limit(local_jobs, volume_backend, script):
    backend = volume_backend(mount_mechanism="namespace")
    shm = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}

    job_dir = run_job(backend, "shm", ["python", script("shm.py", SHM_PROBE)],
                      spec=pod_volumes([shm], [{"name": "shm", "mountPath": "/dev/shm"}]))

    assert int((job_dir / "shm").read_text()) == 64 * 2**20
    assert not os.path.exists("/dev/shm/trainjob-test-marker"), "the node's /dev/shm is its own"
    assert "shm (emptyDir) -> tmpfs 64Mi per node at /dev/shm" in event(backend, "shm", "VolumesMounted")


@pytest.mark.parametrize("mechanism", ["namespace", "env"])
def test_memory_empty_dir_larger_than_the_machine_is_refused_with_the_numbers(volume_backend, script, mechanism):
    backend = volume_backend(mount_mechanism=mechanism)
    shm = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Ti"}}
    job = trainjob_resource("huge", ["python", script("shm.py", SHM_PROBE)], num_nodes=2,
                            spec=pod_volumes([shm], [{"name": "shm", "mountPath": "/dev/shm"}]))

    with pytest.raises(ValidationError, match=r"volumes\[shm\]\.emptyDir\.sizeLimit: 2 node\(s\) x 64Ti "
                                              r"\(131072\.0Gi\) exceeds the [0-9.]+Gi of .*; at most [0-9.]+Gi per node"):
        backend.apply(job)

    with pytest.raises(NotFoundError):
        backend.get_job("huge")
    assert not backend.store.job_dir("huge").exists()


def test_memory_empty_dir_without_namespaces_lives_in_dev_shm_until_the_job_is_deleted(local_jobs, volume_backend, script):
    backend = volume_backend(mount_mechanism="env")
    writer = script("shm.py", """
        import os, sys
        open(os.path.join(sys.argv[1], "in-memory"), "w").write("kept")
    """)
    shm = {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}

    run_job(backend, "memo", ["python", writer], args=["/cache"],
            spec=pod_volumes([shm], [{"name": "cache", "mountPath": "/cache"}]))

    [scratch] = volumes.read_host_volumes(backend.store.job_dir("memo")).scratch
    assert scratch.startswith("/dev/shm/trainjob-memo-")
    assert (Path(scratch) / "cache" / "node-0" / "in-memory").read_text() == "kept"
    backend.delete_job("memo")
    assert not os.path.exists(scratch)


def test_host_path_is_checked_as_the_kubelet_does_and_mounted_read_only(local_jobs, volume_backend, script, tmp_path):
    backend = volume_backend(mount_mechanism="namespace")
    host = tmp_path / "host-data"
    host.mkdir()
    (host / "weights.txt").write_text("42")
    reader = script("reader.py", READER)

    def job(name: str, host_path: dict[str, Any]) -> Any:
        return trainjob_resource(name, ["python", reader], args=["/weights"], spec=pod_volumes(
            [{"name": "w", "hostPath": host_path}], [{"name": "w", "mountPath": "/weights", "readOnly": True}]))

    with pytest.raises(ValidationError, match=r"volumes\[w\]\.hostPath\.path: type Directory needs an existing "
                                              r"directory at .*/missing; found nothing"):
        backend.apply(job("missing", {"path": str(tmp_path / "missing"), "type": "Directory"}))
    with pytest.raises(ValidationError, match=r"type File needs an existing file at .*host-data; found a directory"):
        backend.apply(job("notfile", {"path": str(host), "type": "File"}))
    backend.apply(job("made", {"path": str(tmp_path / "made"), "type": "DirectoryOrCreate"}))
    assert backend.wait_for_job_status("made", timeout=60).status == "Complete"
    assert (tmp_path / "made").is_dir()

    job_dir = backend.store.job_dir("hosted")
    backend.apply(job("hosted", {"path": str(host), "type": "Directory"}))
    assert backend.wait_for_job_status("hosted", timeout=60).status == "Complete"

    assert json.loads((job_dir / "found.json").read_text()) == {"weights.txt": "42", "write": "Read-only file system"}
    backend.delete_job("hosted")
    assert (host / "weights.txt").read_text() == "42", "deleting a job leaves a hostPath alone"


def test_config_map_from_a_file_is_mounted_and_a_missing_one_names_the_flag(local_jobs, volume_backend, script, tmp_path):
    backend = volume_backend(mount_mechanism="namespace")
    config = tmp_path / "train.yaml"
    config.write_text("lr: 0.1\n")
    reader = script("reader.py", READER)
    spec = pod_volumes([{"name": "cfg", "configMap": {"name": "train-config"}}],
                       [{"name": "cfg", "mountPath": "/etc/train"}])

    with pytest.raises(ValidationError, match=r"volumes\[cfg\]\.configMap\.name: configMap 'train-config' was not "
                                              r"given; give its file or directory with --config-map NAME=PATH"):
        backend.apply(trainjob_resource("nocfg", ["python", reader], args=["/etc/train"], spec=spec))

    backend.apply(trainjob_resource("cfg", ["python", reader], args=["/etc/train"], spec=spec),
                  config_maps={"train-config": config})
    assert backend.wait_for_job_status("cfg", timeout=60).status == "Complete"

    found = json.loads((backend.store.job_dir("cfg") / "found.json").read_text())
    assert found == {"train.yaml": "lr: 0.1\n", "write": "Read-only file system"}, "configMaps are read-only"


def test_config_map_items_pick_and_rename_keys(local_jobs, volume_backend, script, tmp_path):
    config = tmp_path / "configs"
    config.mkdir()
    (config / "a.yaml").write_text("a")
    (config / "b.yaml").write_text("b")
    backend = volume_backend(mount_mechanism="env", config_maps={"cfgs": config})
    reader = script("reader.py", READER)
    spec = pod_volumes([{"name": "cfg", "configMap": {"name": "cfgs", "items": [{"key": "b.yaml", "path": "sub/b"}]}}],
                       [{"name": "cfg", "mountPath": "/etc/train"}])

    backend.apply(trainjob_resource("items", ["python", reader], args=["/etc/train/sub"], spec=spec))
    assert backend.wait_for_job_status("items", timeout=60).status == "Complete"

    found = json.loads((backend.store.job_dir("items") / "found.json").read_text())
    assert found["b"] == "b" and "a" not in found


@pytest.mark.parametrize(("volume", "kind"), [
    ({"secret": {"secretName": "token"}}, "secret"),
    ({"nfs": {"server": "nas", "path": "/export"}}, "nfs"),
    ({"csi": {"driver": "oss.csi"}}, "csi"),
])
def test_unsupported_volume_kinds_are_refused_naming_what_works_locally(volume_backend, script, volume, kind):
    backend = volume_backend()
    job = trainjob_resource("secretive", ["python", script("x.py", "print(1)")],
                            spec=pod_volumes([{"name": "v", **volume}], [{"name": "v", "mountPath": "/v"}]))

    with pytest.raises(ValidationError, match=rf"volumes\[v\]: {kind} volumes are not supported by the local "
                                              r"backend; supported locally: persistentVolumeClaim, hostPath, "
                                              r"emptyDir, configMap"):
        backend.apply(job)
    with pytest.raises(NotFoundError):
        backend.get_job("secretive")


def test_volumes_root_comes_from_the_environment_when_the_config_does_not_set_it(trainjob_home, tmp_path, monkeypatch):
    monkeypatch.setenv(volumes.VOLUMES_ROOT_ENV, str(tmp_path / "nas"))
    assert volumes.VolumeSettings.resolve(trainjob_home).volumes_root == tmp_path / "nas"
    assert volumes.VolumeSettings.resolve(trainjob_home, tmp_path / "cfg").volumes_root == tmp_path / "cfg"
    monkeypatch.delenv(volumes.VOLUMES_ROOT_ENV)
    assert volumes.VolumeSettings.resolve(trainjob_home).volumes_root == trainjob_home.resolve() / "volumes"
    with pytest.raises(ValidationError, match="mount_mechanism: must be one of auto, namespace, env, got 'bind'"):
        volumes.VolumeSettings.resolve(trainjob_home, mechanism="bind")


@pytest.mark.parametrize(("value", "rewritten"), [
    ("/output", "/host/out"),
    ("/output/ckpt/step-3", "/host/out/ckpt/step-3"),
    ("--save-dir=/output/ckpt", "--save-dir=/host/out/ckpt"),
    ("/outputs", "/outputs"),
    ("/data/cache/x", "/host/cache/x"),
    ("relative/output", "relative/output"),
])
def test_paths_under_a_mount_path_are_rewritten_the_longest_first(value, rewritten):
    mapping = {"/output": "/host/out", "/data": "/host/data", "/data/cache": "/host/cache"}
    assert volumes.rewrite_path(value, mapping) == rewritten


def test_a_mount_over_the_job_directory_is_refused(volume_backend, script, trainjob_home):
    backend = volume_backend(mount_mechanism="namespace")
    home = str(trainjob_home.resolve())
    job = trainjob_resource("hider", ["python", script("x.py", "print(1)")], spec=claim("c", "c", home))
    with pytest.raises(ValidationError, match=rf"mountPath {home} would hide the job's directory"):
        backend.apply(job)


def test_a_mount_that_fails_when_the_node_starts_fails_the_job_with_the_reason_in_its_log(local_jobs, volume_backend, script,
                                                                                          tmp_path):
    backend = volume_backend(mount_mechanism="namespace")
    host = tmp_path / "vanishing"
    host.mkdir()
    spec = pod_volumes([{"name": "w", "hostPath": {"path": str(host), "type": "Directory"}}],
                       [{"name": "w", "mountPath": "/weights"}])
    backend.apply(trainjob_resource("late", ["python", script("x.py", "print('ran')")], spec={**spec, "suspend": True}))
    host.rmdir()  # gone by the time the node starts

    backend.resume_job("late")

    with pytest.raises(JobFailedError, match="node-0"):
        backend.wait_for_job_status("late", timeout=60)
    log = "\n".join(line.text for line in backend.logs("late"))
    assert f"cannot mount the node's volumes: bind {host} at /weights: No such file or directory" in log
    assert "ran" not in log
