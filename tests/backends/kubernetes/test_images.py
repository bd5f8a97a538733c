"""The images the README tells users to build, as the test cluster built them from the repo's Dockerfiles: the
operator image (``deploy/Dockerfile``) runs ``trainjob operator`` with every module the operator imports and without
torch; the training image (``deploy/training.Dockerfile``) has torch and trainjob. Each is run with buildah, from
the same local image the registry serves to the nodes."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kubetest.controlplane import ControlPlane
from kubetest.images import Builder, cache_dir, local_reference

#: Every module ``trainjob operator`` loads when it runs (its CLI, kopf, the Kubernetes client, metrics, the status
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
