"""``plan --auto``: the search reproduces seed 003's selection table (or says why not, with numbers), every layout it
prints is one the library builds, and bad input is named."""

from __future__ import annotations

import json
import re

import click
import pytest
from click.testing import CliRunner

from trainjob.cli import tools
from trainjob.errors import ValidationError
from trainjob.tools.sizing.layout_search import Hardware, derived_shape, realisation, search_layouts, seed_row
from trainjob.tools.sizing.memory import estimate_memory, pipeline_bubble_fraction
from trainjob.tools.training_setup import TrainingSetup

GB = 1e9
A100 = dict(gpu_memory=80 * GB)


def _auto(params: float, gpus: int, nodes: int, **extra):  # noqa: ANN202
    return search_layouts(Hardware(gpus=gpus, nodes=nodes, **A100), params=params, **extra)


# Seed 003, 训练规模推荐: <1B on 1-8 GPUs -> DDP; 1B-10B on 8-64 -> FSDP (ZeRO-2 equivalent); 10B-100B on 64-512 ->
# ZeRO-3 + CPU offload; 100B+ on 512+ -> Megatron 3-D. Its FSDP memory table adds: 70B on 8 A100s needs CPU offload.
@pytest.mark.parametrize(
    ("params", "gpus", "nodes", "chosen"),
    [
        (0.5e9, 8, 1, {"DDP"}),
        (7e9, 8, 1, {"FSDP (ZeRO-2)"}),
        (70e9, 8, 1, {"ZeRO-3 + CPU offload"}),
        (70e9, 8, 8, {"ZeRO-3 + CPU offload", "ZeRO-3 (FSDP)", "3-D (TP+PP+DP)"}),  # seed: "ZeRO-3 + offload or 3-D"
        (175e9, 8, 64, {"3-D (TP+PP+DP)"}),
    ],
)
def test_the_seed_selection_table_is_reproduced(params: float, gpus: int, nodes: int, chosen: set[str]) -> None:
    plan = _auto(params, gpus, nodes)
    assert plan.ranked[0].category in chosen, plan.seed_note
    assert plan.seed_note.startswith(f"Seed 003 recommends {seed_row(params).recommends}")


def test_where_the_planner_disagrees_with_the_seed_it_says_why_with_numbers() -> None:
    # 70B on 64 GPUs: the seed's ZeRO-3 + CPU offload fits, but needs activation checkpointing and PCIe copies.
    note = _auto(70e9, 8, 8).seed_note
    assert "the planner picks 3-D (TP+PP+DP)" in note
    assert re.search(r"the best ZeRO-3 \+ CPU offload layout takes [\d.]+ s/step \([\d.]+x\)", note), note
    assert re.search(r"offload \(float32 shard of [\d.]+B parameters over PCIe, Adam on the CPU\) adds [\d.]+ s", note)
    # 3B on 8 GPUs: plain DDP fits (16 x 3 = 48 GB of model states), so the seed's FSDP buys nothing.
    note = _auto(3e9, 8, 1).seed_note
    assert "picks DDP" in note and "the same estimated time, and the planner prefers fewer moving parts" in note
    # 7B on 32 GPUs over 25 GB/s between nodes: ZeRO-2's gradient traffic is not hidden.
    note = _auto(7e9, 8, 4).seed_note
    assert re.search(r"data-parallel traffic not hidden by compute \([\d.]+ GB per GPU per step\) adds [\d.]+ s", note)


def test_nothing_fits_names_the_smallest_need() -> None:
    plan = _auto(1e12, 8, 1)
    assert plan.ranked == []
    assert plan.smallest is not None and plan.smallest.memory.total > 0
    assert "nothing fits on 8 GPUs" in plan.seed_note


def test_ranked_by_estimated_step_time_and_all_fit() -> None:
    plan = _auto(70e9, 8, 8, top=10)
    times = [c.step_time for c in plan.ranked]
    assert times == sorted(times)
    assert all(c.memory.total <= 0.9 * 80 * GB for c in plan.ranked)
    layouts = [(c.setup.tp, c.setup.pp, c.setup.zero, c.setup.cpu_offload) for c in plan.ranked]
    assert len(set(layouts)) == len(layouts)


@pytest.mark.parametrize(("params", "gpus", "nodes"), [(0.5e9, 8, 1), (7e9, 8, 2), (70e9, 8, 8), (70e9, 8, 1), (175e9, 8, 64)])
def test_every_printed_layout_is_one_the_library_builds(params: float, gpus: int, nodes: int) -> None:
    from trainjob.torch.parallel import ParallelDims, check_microbatches
    from trainjob.torch.parallel.compose import _check_data_parallel
    from trainjob.torch.precision import precision_dtype

    for candidate in _auto(params, gpus, nodes, top=10).ranked:
        s = candidate.setup
        call, _ = realisation(candidate)
        dims = ParallelDims(dp_shard=s.dp, tp=s.tp, pp=s.pp, world_size=s.world_size)
        if call.startswith("model = prepare_model"):
            assert (s.zero, s.tp, s.pp, s.cpu_offload) == (0, 1, 1, False)
        else:
            assert f"ParallelDims(dp_shard={s.dp}, tp={s.tp}, pp={s.pp})" in call
            _check_data_parallel(dims, s.zero, precision_dtype(s.dtype if s.dtype != "fp32" else None), s.cpu_offload)
        if s.pp > 1:
            assert f'PipelineConfig("{s.schedule}", microbatches={s.micro_batches})' in call
            check_microbatches(s.schedule, s.micro_batches, s.pp, s.pp * s.stages_per_rank)
        # The groups the estimate treats as inside a node are inside a node in the library's layout.
        for group in ("tp", "pp", "dp"):
            crosses = any(len({r // gpus for r in g}) > 1 for g in dims.groups(group))
            assert s.group_spans_nodes(group) == crosses


def test_a_shape_is_assumed_from_params_only_when_none_is_given() -> None:
    assert derived_shape(70e9) == (72, 9216, 72)
    layers, hidden, heads = derived_shape(0.5e9)
    assert hidden % heads == 0 and 12 * layers * hidden**2 == pytest.approx(0.5e9, rel=0.15)
    plan = search_layouts(Hardware(gpus=8, nodes=1, **A100), layers=24, hidden=2048, heads=16, seq=1024)
    assert not plan.shape_assumed
    assert (plan.ranked[0].setup.layers, plan.ranked[0].setup.seq) == (24, 1024)


def test_schedules_change_bubble_and_in_flight_activations() -> None:
    shape = dict(params=1e9, layers=16, hidden=1024, heads=16, seq=512, gpus=4, pp=4, micro_batches=8)
    one_f_one_b, gpipe = (estimate_memory(TrainingSetup(**shape, schedule=s)) for s in ("1F1B", "GPipe"))
    assert gpipe.activations == pytest.approx(one_f_one_b.activations * 8 / 4)  # m in flight instead of min(p, m)
    assert pipeline_bubble_fraction(4, 8, stages_per_rank=2) == pytest.approx(3 / 19)
    with pytest.raises(ValidationError, match=r"divisible by pp \(4\) × 2 stages per rank"):
        TrainingSetup(**{**shape, "layers": 12}, schedule="Interleaved1F1B")


def test_cpu_offload_keeps_the_shards_in_host_memory() -> None:
    setup = TrainingSetup(params=70e9, layers=80, hidden=8192, heads=64, seq=2048, gpus=8, zero=3, cpu_offload=True)
    plan = estimate_memory(setup)
    assert plan.model_states == 0
    assert plan.offloaded_to_host / GB == pytest.approx(16 * 70 / 8)  # float32 params + grads + Adam moments
    assert plan.gathered / GB == pytest.approx(8 * 12 * 8192**2 / GB)  # 2 blocks' bf16 params, 1 block's fp32 grads


@pytest.mark.parametrize(
    ("kwargs", "path", "fragment"),
    [
        (dict(params=7e9, zero=3), "zero", "is what --auto chooses"),
        (dict(params=7e9, tp=2), "tp", "is what --auto chooses"),
        (dict(params=7e9, dtype="int4"), "dtype", "must be one of bf16, fp16, fp32"),
        (dict(params=7e9, layers=32), "layers", "give all of layers, hidden and heads"),
        (dict(layers=3, hidden=192, heads=3, global_batch=7), "global_batch", "use a multiple of the GPU count"),
        (dict(params=-1), "params", "must be > 0"),
    ],
)
def test_bad_auto_inputs_are_named(kwargs: dict, path: str, fragment: str) -> None:
    global_batch = kwargs.pop("global_batch", 512)
    with pytest.raises(ValidationError) as caught:
        search_layouts(Hardware(gpus=8, nodes=1, **A100), global_batch=global_batch, **kwargs)
    assert caught.value.path == path
    assert fragment in caught.value.message


def test_bad_hardware_is_named() -> None:
    with pytest.raises(ValidationError) as caught:
        search_layouts(Hardware(gpus=0, nodes=1, gpu_memory=0), params=7e9)
    assert {e.path for e in caught.value.errors} == {"gpus", "gpu_memory"}


@pytest.fixture
def run():  # noqa: ANN201
    group = click.Group("trainjob")
    tools.register(group)
    return lambda *args: CliRunner().invoke(group, list(args))


def test_cli_prints_the_ranked_layouts_resources_and_calls(run) -> None:  # noqa: ANN001
    result = run("plan", "--auto", "--params", "70B", "--gpus", "8", "--nodes", "8", "--gpu-memory", "80GB",
                 "--bandwidth", "intra=300GB/s,inter=25GB/s", "--top", "3")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "trainer: {numNodes: 8, numProcPerNode: 8, resourcesPerNode: {limits: {nvidia.com/gpu: 8}}}" in result.output
    assert "model = parallelize(model, ParallelDims(dp_shard=" in result.output
    assert "Seed 003 recommends DeepSpeed ZeRO-3 + CPU offload" in result.output
    assert result.output.count("#") >= 4  # the table's header and three layouts


def test_cli_json(run) -> None:  # noqa: ANN001
    result = run("plan", "--auto", "--params", "0.5B", "--gpus", "8", "--gpu-memory", "80GB", "-o", "json")
    data = json.loads(result.output)
    best = data["ranked"][0]
    assert (best["category"], best["call"]) == ("DDP", 'model = prepare_model(model, "ddp", mixed_precision="bf16")')
    assert best["trainjob"]["trainer"]["numNodes"] == 1


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["--auto", "--params", "7B", "--gpus", "8"], "error: --gpu-memory: is needed with --auto", 2),
        (["--auto", "--params", "7B", "--gpu-memory", "80GB", "--zero", "2"], "error: --zero: is what --auto chooses", 2),
        (["--auto", "--params", "7B", "--gpu-memory", "80GB", "--pp", "2"], "error: --pp: is what --auto chooses", 2),
        (["--params", "7B", "--top", "3"], "error: --top: is an option of --auto", 2),
        (["--auto", "--params", "1T", "--gpus", "8", "--gpu-memory", "80GB"], "No layout fits", 1),
    ],
)
def test_cli_bad_auto_input(run, args: list[str], message: str, code: int) -> None:  # noqa: ANN001
    result = run("plan", *args)
    assert result.exit_code == code, result.output
    assert message in result.output
