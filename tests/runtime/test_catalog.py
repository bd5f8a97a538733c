"""Built-in runtimes and finding the runtime a job refers to."""

from __future__ import annotations

import pytest

from trainjob.api import ClusterTrainingRuntime, RuntimeRef, TrainingRuntime
from trainjob.errors import NotFoundError
from trainjob.runtime import DEFAULT_RUNTIME, builtin_runtimes, find_runtime

NODE_ONLY = {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {}}]}}}


def test_the_builtin_runtimes_are_torch_mpi_ray_and_torchtune_with_torch_distributed_the_default():
    runtimes = builtin_runtimes()
    assert sorted(runtimes) == [
        "deepspeed-distributed", "mpi-distributed", "ray-distributed", "torch-distributed",
        "torch-distributed-volcano", "torchtune-llama3.2-1b", "torchtune-llama3.2-3b", "torchtune-qwen2.5-1.5b",
    ]
    assert DEFAULT_RUNTIME == "torch-distributed"
    default = runtimes[DEFAULT_RUNTIME]
    assert (default.spec.ml_policy.num_nodes, default.spec.ml_policy.torch.num_proc_per_node) == (1, "auto")
    assert default.spec.pod_group_policy is None
    assert runtimes["torch-distributed-volcano"].spec.pod_group_policy.volcano is not None


def test_builtin_runtimes_are_fresh_copies():
    builtin_runtimes()["torch-distributed"].spec.ml_policy.num_nodes = 7
    assert builtin_runtimes()["torch-distributed"].spec.ml_policy.num_nodes == 1


def test_each_builtin_runtime_is_found_from_its_own_file_as_a_fresh_copy():
    """``find_runtime`` reads only ``builtin/NAME.yaml`` for a built-in: each file must hold the runtime it is
    named after, and what it returns must be the same runtime as the full catalog's, not a shared object."""
    from importlib import resources

    folder = resources.files("trainjob.runtime") / "builtin"
    files = sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml"))
    runtimes = builtin_runtimes()
    assert files == sorted(runtimes)
    for name, runtime in runtimes.items():
        found = find_runtime(name)
        assert found.to_dict() == runtime.to_dict()
        found.spec.ml_policy.num_nodes = 99
        assert find_runtime(name).spec.ml_policy.num_nodes == runtime.spec.ml_policy.num_nodes


def test_a_runtime_name_is_never_read_as_a_path():
    for name in ("../catalog", "builtin/torch-distributed", "x" * 300):
        with pytest.raises(NotFoundError, match="known ClusterTrainingRuntimes: deepspeed-distributed"):
            find_runtime(name)


def test_extra_runtimes_win_over_builtins_of_the_same_name():
    mine = ClusterTrainingRuntime.from_dict({"metadata": {"name": "torch-distributed"}, "spec": NODE_ONLY})
    assert find_runtime("torch-distributed", [mine]) is mine
    assert find_runtime("torch-distributed").spec.ml_policy is not None


def test_a_training_runtime_is_found_by_kind_and_namespace():
    rt = TrainingRuntime.from_dict({"metadata": {"name": "rt", "namespace": "team"}, "spec": NODE_ONLY})
    ref = RuntimeRef(name="rt", kind="TrainingRuntime")
    assert find_runtime(ref, [rt], namespace="team") is rt
    with pytest.raises(NotFoundError, match="TrainingRuntime 'rt' not found in namespace 'other'"):
        find_runtime(ref, [rt], namespace="other")


def test_an_unknown_runtime_names_the_known_ones():
    with pytest.raises(NotFoundError) as err:
        find_runtime("torch-distribute")
    assert str(err.value) == (
        "ClusterTrainingRuntime 'torch-distribute' not found; known ClusterTrainingRuntimes: deepspeed-distributed, "
        "mpi-distributed, ray-distributed, torch-distributed, torch-distributed-volcano, torchtune-llama3.2-1b, "
        "torchtune-llama3.2-3b, torchtune-qwen2.5-1.5b"
    )
