"""numProcPerNode: auto | cpu | gpu | <int>, from the TrainJob or the runtime, against the node's resources."""

from __future__ import annotations

import pytest

from trainjob.errors import ValidationError
from trainjob.runtime import resolve

GPU4 = {"limits": {"nvidia.com/gpu": 4, "cpu": "16"}}

# (case id, runtime numProcPerNode, runtime container resources, TrainJob trainer fields, expected)
CASES = [
    ("integer_is_kept", 4, GPU4, {}, 4),
    ("auto_uses_gpu_count_when_gpus_requested", "auto", GPU4, {}, 4),
    ("auto_uses_cpu_count_without_gpus", "auto", {"requests": {"cpu": "16"}}, {}, 16),
    ("auto_rounds_fractional_cpu_up", "auto", {"requests": {"cpu": "2.5"}}, {}, 3),
    ("auto_rounds_millicores_up", "auto", {"requests": {"cpu": "2500m"}}, {}, 3),
    ("auto_gives_at_least_one_process", "auto", {"requests": {"cpu": "0.7"}}, {}, 1),
    ("auto_without_cpu_or_gpu_gives_one", "auto", {}, {}, 1),
    ("unset_means_auto", None, GPU4, {}, 4),
    ("cpu_uses_cpu_count_even_with_gpus", "cpu", GPU4, {}, 16),
    ("cpu_without_cpu_request_gives_one", "cpu", {"limits": {"nvidia.com/gpu": 2}}, {}, 1),
    ("gpu_uses_gpu_count", "gpu", GPU4, {}, 4),
    ("any_gpu_vendor_counts", "auto", {"limits": {"amd.com/gpu": 2}}, {}, 2),
    (
        "requests_win_over_limits",
        "auto",
        {"requests": {"nvidia.com/gpu": 2}, "limits": {"nvidia.com/gpu": 4}},
        {},
        2,
    ),
    ("cpu_request_wins_over_cpu_limit", "cpu", {"requests": {"cpu": "2"}, "limits": {"cpu": "8"}}, {}, 2),
    ("trainjob_integer_overrides_runtime", "auto", GPU4, {"numProcPerNode": 2}, 2),
    ("trainjob_keyword_overrides_runtime", "gpu", GPU4, {"numProcPerNode": "cpu"}, 16),
    (
        "trainjob_resources_replace_runtime_resources",
        "auto",
        GPU4,
        {"resourcesPerNode": {"requests": {"nvidia.com/gpu": 8}}},
        8,
    ),
    (
        "trainjob_cpu_resources_without_gpus_give_cpu_count",
        "auto",
        GPU4,
        {"resourcesPerNode": {"limits": {"cpu": "3500m"}}},
        4,
    ),
]


@pytest.mark.parametrize(
    ("runtime_setting", "resources", "trainer", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_num_proc_per_node(make_job, make_runtime, runtime_setting, resources, trainer, expected):
    torch = {} if runtime_setting is None else {"numProcPerNode": runtime_setting}
    runtime = make_runtime(mlPolicy={"torch": torch}, container={"resources": resources})
    plan = resolve(make_job(runtime="rt", **trainer), runtime)
    assert plan.num_proc_per_node == expected
    assert plan.trainer().container().env_dict()["PET_NPROC_PER_NODE"] == str(expected)


def test_gpu_without_any_gpu_requested_is_an_error_naming_the_runtime_field(make_job, make_runtime):
    runtime = make_runtime(
        mlPolicy={"torch": {"numProcPerNode": "gpu"}}, container={"resources": {"limits": {"cpu": "4"}}}
    )
    with pytest.raises(ValidationError) as err:
        resolve(make_job(runtime="rt"), runtime)
    assert err.value.path == "spec.mlPolicy.torch.numProcPerNode"
    assert str(err.value) == (
        "spec.mlPolicy.torch.numProcPerNode: (in ClusterTrainingRuntime 'rt') is 'gpu' but the trainer requests no "
        "GPU (e.g. nvidia.com/gpu in resourcesPerNode); request GPUs or use auto, cpu or an integer"
    )


def test_gpu_from_the_trainjob_without_gpus_names_the_trainjob_field(make_job, make_runtime):
    with pytest.raises(ValidationError, match=r"^spec\.trainer\.numProcPerNode: is 'gpu' but"):
        resolve(make_job(runtime="rt", numProcPerNode="gpu"), make_runtime(mlPolicy={"torch": {}}))
