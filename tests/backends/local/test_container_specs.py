"""How a node that runs as a container is started: the engine's command line and environment, and the configs."""

from __future__ import annotations

import pytest

from trainjob.backends.local.client.backend import ContainerBackendConfig, local_config
from trainjob.backends.local.containers import (
    JOB_LABEL,
    SITE_MOUNT,
    ContainerSpec,
    container_name,
    install_first,
    memory_words,
    network_name,
    node_command,
)
from trainjob.errors import ValidationError

SPEC = ContainerSpec(engine="podman", engine_path="/usr/bin/podman", image="localhost/train:1", cpus=1.5,
                     memory_bytes=600 * 2**20, engine_env={"PATH": "/usr/bin", "CONTAINERS_STORAGE_CONF": "/s.conf"})


def _flags(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def test_a_node_is_an_attached_container_on_the_jobs_network_with_its_limits_mounts_and_variables():
    env = {"PET_MASTER_ADDR": "mnist-node-0-0", "PATH": "/opt/venv/bin:/usr/bin", "SECRET": "s3cr3t"}
    argv, process_env = node_command(SPEC, "mnist", "/home/me/.trainjob/jobs/mnist", 1, ["torchrun", "train.py"],
                                     env, mounts=[("/data", "/srv/data", True, None), ("/dev/shm", "", False, 2**30)],
                                     cpuset=[2, 3])
    assert argv[:2] == ["/usr/bin/podman", "run"] and "--rm" not in argv and "-d" not in argv
    assert argv[-3:] == ["localhost/train:1", "torchrun", "train.py"]
    assert _flags(argv, "--name") == [container_name("mnist", "/home/me/.trainjob/jobs/mnist", 1)]
    assert _flags(argv, "--network") == [network_name("mnist", "/home/me/.trainjob/jobs/mnist")]
    assert _flags(argv, "--network-alias") == ["mnist-node-1-0"] == _flags(argv, "--hostname")
    assert _flags(argv, "--cpus") == ["1.5"] and _flags(argv, "--cpuset-cpus") == ["2,3"]
    assert _flags(argv, "--memory") == [f"{600 * 2**20}b"] == _flags(argv, "--memory-swap")  # no swap past it
    assert f"{JOB_LABEL}=/home/me/.trainjob/jobs/mnist" in _flags(argv, "--label")
    volumes = _flags(argv, "-v")
    assert "/home/me/.trainjob/jobs/mnist:/home/me/.trainjob/jobs/mnist" in volumes  # logs, metrics, stacks
    assert any(v.endswith(f":{SITE_MOUNT}:ro") for v in volumes) and "/srv/data:/data:ro" in volumes
    assert _flags(argv, "--tmpfs") == [f"/dev/shm:size={2**30}"]
    # values reach the container by name, from the engine's environment: none on the command line but the
    # engine's own (PATH), which would otherwise be the engine's
    assert _flags(argv, "-e") == ["PET_MASTER_ADDR", "PATH=/opt/venv/bin:/usr/bin", "SECRET"]
    assert "s3cr3t" not in " ".join(argv)
    assert process_env == {"PET_MASTER_ADDR": "mnist-node-0-0", "SECRET": "s3cr3t", "PATH": "/usr/bin",
                           "CONTAINERS_STORAGE_CONF": "/s.conf"}


@pytest.mark.parametrize(("engine", "flag"), [("podman", ["--device", "nvidia.com/gpu=3"]),
                                              ("docker", ["--gpus", "device=3"])])
def test_gpus_go_through_each_engines_device_flag(engine, flag):
    argv = node_command(ContainerSpec(engine=engine, engine_path=engine, image="i"), "j", "/d", 0, ["x"], {},
                        gpus=["3"])[0]
    assert argv[argv.index(flag[0]):argv.index(flag[0]) + 2] == flag


def test_packages_are_installed_in_the_container_before_the_command():
    argv = install_first(["torchrun", "/job/train.py"], ["tqdm>=4", "rich"], ["https://pypi.example/simple"])
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["sh", "torchrun", "/job/train.py"]
    assert "pip install" in argv[2] and "'tqdm>=4' rich" in argv[2] and "--index-url https://pypi.example/simple" in argv[2]


@pytest.mark.parametrize(("count", "said"), [(600 * 2**20, "600Mi"), (2 * 2**30, "2Gi"), (1500, "1500b")])
def test_memory_limits_are_said_as_a_pod_would(count, said):
    assert memory_words(count) == said


def test_container_backend_configs_select_the_container_mode_of_the_local_backend():
    from kubeflow.trainer import ContainerBackendConfig as KubeflowContainerBackendConfig

    ours = local_config(ContainerBackendConfig(container_runtime="podman", pull_policy="Never", auto_remove=False))
    assert (ours.containers, ours.container_runtime, ours.pull_policy, ours.auto_remove) == (True, "podman", "Never", False)
    theirs = local_config(KubeflowContainerBackendConfig(container_runtime="docker"))
    assert (theirs.containers, theirs.container_runtime, theirs.pull_policy) == (True, "docker", "IfNotPresent")
    with pytest.raises(ValidationError, match="container_host"):
        local_config(ContainerBackendConfig(container_host="tcp://elsewhere:2375"))
