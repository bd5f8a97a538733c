"""The images the README tells users to build, as the test cluster built them from the repo's Dockerfiles: the
operator image (``deploy/Dockerfile``) runs ``trainjob operator`` with every module the operator imports and without
torch; the training image (``deploy/training.Dockerfile``) has torch and trainjob. Each is run with buildah, from
the same local image the registry serves to the nodes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from jobtest.tiers import starts
from kubetest.controlplane import ControlPlane
from kubetest.images import Builder, cache_dir, local_reference

#: Every module ``trainjob operator`` loads when it runs (its CLI, its watches, metrics, the status
#: endpoint's TLS), and the answer when torch is asked for.
IMPORTS = ("import importlib.util, trainjob.backends.kubernetes.operator, trainjob.backends.kubernetes.status_server;"
           "print('torch', importlib.util.find_spec('torch'))")


@pytest.fixture
def run_in(control_plane: ControlPlane) -> Iterator[Callable[..., str]]:
    builder = Builder(cache_dir(), control_plane.root / "logs" / "images.log")
    containers: list[str] = []

    def run(name: str, *argv: str) -> str:
        local = local_reference(control_plane.images[name])
        container = builder.buildah("from", "--pull-never", "--quiet", local).strip()
        containers.append(container)
        return builder.buildah("run", "--network=none", container, "--", *argv, what=f"{' '.join(argv)} in {name}")

    yield run
    for container in containers:
        builder.buildah("rm", container)


def test_the_operator_image_runs_the_operator_command_without_torch(run_in: Callable[..., str]) -> None:
    assert "Run the operator: reconcile TrainJobs into JobSets" in run_in("trainjob-operator", "trainjob", "operator",
                                                                          "--help")
    assert run_in("trainjob-operator", "python", "-c", IMPORTS).strip() == "torch None"
    assert run_in("trainjob-operator", "id", "-u").strip() == "65532"


def test_the_training_image_has_torch_and_trainjob(run_in: Callable[..., str]) -> None:
    printed = run_in("trainjob-train", "python", "-c", "import torch, trainjob.torch; print(torch.__version__)")
    assert printed.strip().startswith("2."), printed


@pytest.fixture
@starts("procs")
def scratch_builder(tmp_path: Path) -> Builder:
    """buildah on storage of its own under ``tmp_path``."""
    if os.geteuid() != 0 or shutil.which("buildah") is None:
        pytest.skip("needs root and buildah")
    (tmp_path / "cache").mkdir()
    return Builder(tmp_path / "cache", tmp_path / "build.log")


def test_working_containers_left_on_older_images_do_not_keep_them(scratch_builder: Builder, tmp_path: Path) -> None:
    """A build or test killed between ``buildah from`` and ``buildah rm`` leaves a working container, which keeps its
    image's layers and makes buildah refuse to remove the image: a newer build removes the containers left on the
    images it replaces, and those left on images that lost their name; a container on the kept image stays."""
    builder = scratch_builder

    def image(tag: str) -> str:
        container = builder.buildah("from", "scratch").strip()
        builder.buildah("config", "--label", f"tag={tag}", container)
        builder.buildah("commit", "--quiet", container, f"localhost/trainjob-test/stale:{tag}")
        builder.buildah("rm", container)
        return f"localhost/trainjob-test/stale:{tag}"

    def containers() -> list[str]:
        return builder.buildah("containers", "--format={{.ContainerName}}").split()

    old, new = image("old"), image("new")
    left = builder.buildah("from", "--pull-never", "--quiet", old).strip()
    kept = builder.buildah("from", "--pull-never", "--quiet", new).strip()
    builder._remove_tags("localhost/trainjob-test/stale", keep=new)
    assert not builder.exists(old)
    assert containers() == [kept]
    assert f"removed {left}" in (tmp_path / "build.log").read_text()

    # An image without a name (as one that a killed build left, or that lost its name while a container was on it).
    scratch = builder.buildah("from", "scratch").strip()
    unnamed = builder.buildah("commit", "--quiet", scratch).strip()
    builder.buildah("rm", scratch)
    nameless = builder.buildah("from", "--pull-never", "--quiet", unnamed).strip()
    second = builder.buildah("from", "--pull-never", "--quiet", unnamed).strip()  # two on one image: removed once
    assert sorted(containers()) == sorted([kept, nameless, second])
    assert sorted(builder.remove_stale_containers()) == sorted([nameless, second])
    assert containers() == [kept]
    assert builder.buildah("images", "--all", "--format={{.Name}}:{{.Tag}}").split() == [new]
    builder.buildah("rm", kept)


def test_the_image_registry_keeps_its_port_while_it_is_free(tmp_path: Path) -> None:
    """buildah skips layers it knows are at that address: the cache's registry serves on the same one each session."""
    import socket

    from kubetest.images import _port_of

    storage = tmp_path / "registry"
    first = _port_of(storage)
    assert (tmp_path / "registry.port").read_text().strip() == str(first)
    assert _port_of(storage) == first
    with socket.socket() as taken:  # another program holds it: a new port, kept from then on
        taken.bind(("127.0.0.1", first))
        taken.listen()
        second = _port_of(storage)
    assert second != first and _port_of(storage) == second
