"""The planner against the seeds' worked examples and the ZeRO paper's figures."""

from __future__ import annotations

import pytest

from trainjob.errors import ValidationError
from trainjob.tools.sizing.communication import estimate_communication
from trainjob.tools.sizing.memory import estimate_memory, optimizer_bytes_per_param, pipeline_bubble_fraction
from trainjob.tools.training_setup import TrainingSetup

GB = 1e9


# ZeRO paper (Rajbhandari et al. 2019), Figure 1: 7.5B parameters, Adam in mixed precision (K = 12), Nd = 64.
@pytest.mark.parametrize(
    ("zero", "expected_gb"),
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)],
)
def test_model_states_match_the_zero_paper_7_5b_on_64_gpus(zero: int, expected_gb: float) -> None:
    plan = estimate_memory(TrainingSetup(params=7.5e9, gpus=8, nodes=8, zero=zero, dtype="fp16"))
    assert round(plan.model_states / GB, 1) == expected_gb


# Seed 003, "ZeRO优化阶段": memory saving 4x (stage 1), 8x (stage 2), Nd (stage 3) as the DP degree grows.
@pytest.mark.parametrize(("zero", "saving"), [(1, 4), (2, 8), (3, 1024)])
def test_zero_savings_approach_the_seed_table(zero: int, saving: float) -> None:
    setup = dict(params=7e9, gpus=8, nodes=128)
    baseline = estimate_memory(TrainingSetup(**setup, zero=0)).model_states
    sharded = estimate_memory(TrainingSetup(**setup, zero=zero)).model_states
    assert baseline / sharded == pytest.approx(saving, rel=0.01)


@pytest.mark.parametrize(
    ("zero", "parameters", "gradients", "optimizer"),
    [(0, 2, 2, 12), (1, 2, 2, 12 / 8), (2, 2, 2 / 8, 12 / 8), (3, 2 / 8, 2 / 8, 12 / 8)],
)
def test_each_stage_shards_what_the_seed_says(
    zero: int, parameters: float, gradients: float, optimizer: float
) -> None:
    plan = estimate_memory(TrainingSetup(params=1e9, gpus=8, zero=zero))
    assert (plan.parameters / GB, plan.gradients / GB, plan.optimizer_states / GB) == pytest.approx(
        (parameters, gradients, optimizer)
    )


# Seed 003, "FSDP vs DDP": 7B on 8xA100 uses 20 GB with FSDP; model states are 16Ψ/8 = 14 GB of it.
def test_fsdp_7b_on_8_gpus_fits_under_the_seed_measurement() -> None:
    plan = estimate_memory(TrainingSetup(params=7e9, gpus=8, zero=3))
    assert plan.model_states / GB == pytest.approx(14.0)
    assert plan.model_states / GB < 20


@pytest.mark.parametrize(
    ("optimizer", "dtype", "k"),
    [
        ("adam", "bf16", 12),
        ("adamw", "fp16", 12),
        ("adam", "fp32", 8),
        ("sgd", "bf16", 8),
        ("sgd", "fp32", 4),
    ],
)
def test_optimizer_state_bytes_per_parameter(optimizer: str, dtype: str, k: int) -> None:
    assert optimizer_bytes_per_param(optimizer, dtype) == k


def test_offload_moves_optimizer_states_to_host() -> None:
    plan = estimate_memory(TrainingSetup(params=7e9, gpus=8, zero=3, offload=True))
    assert plan.optimizer_states == 0
    assert plan.offloaded_to_host / GB == pytest.approx(12 * 7 / 8)


def test_tensor_and_pipeline_parallelism_divide_the_parameters() -> None:
    plan = estimate_memory(TrainingSetup(params=8e9, gpus=8, nodes=2, tp=4, pp=2))
    assert plan.parameters / GB == pytest.approx(2 * 8 / 8)


# Seed 002's Megatron command: 96 layers, hidden 12288, 96 heads, seq 2048, micro-batch 4, global batch 512,
# TP 8, PP 4 (here on 8 nodes of 8 GPUs, so dp = 2).
MEGATRON = dict(layers=96, hidden=12288, heads=96, seq=2048, micro_batch=4, global_batch=512, tp=8, pp=4, gpus=8,
                nodes=8, dtype="fp16")  # fmt: skip


def test_megatron_seed_config_is_a_175b_model_with_a_small_bubble() -> None:
    setup = TrainingSetup(**MEGATRON)
    assert setup.params / GB == pytest.approx(174, rel=0.01)  # 12·L·h², GPT-3 size
    assert (setup.dp, setup.micro_batches) == (2, 64)
    assert estimate_communication(setup).bubble_fraction == pytest.approx(3 / 67)


def test_activation_checkpointing_keeps_only_layer_inputs() -> None:
    plan = estimate_memory(TrainingSetup(**MEGATRON))
    s, b, h, a, t = 2048, 4, 12288, 96, 8
    per_layer = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    held_layers = 96 // 4 * 4  # 24 layers per stage, 4 micro-batches in flight on the first stage
    assert plan.activations == pytest.approx(held_layers * per_layer)
    assert plan.activations_checkpointed == pytest.approx(held_layers * 2 * s * b * h + per_layer)
    flash = estimate_memory(TrainingSetup(**MEGATRON, flash_attention=True))
    assert flash.activations == pytest.approx(held_layers * s * b * h * (10 + 24 / t))


@pytest.mark.parametrize(("stages", "micro_batches", "bubble"), [(1, 8, 0.0), (4, 1, 0.75), (4, 13, 0.1875)])
def test_pipeline_bubble_fraction(stages: int, micro_batches: int, bubble: float) -> None:
    assert pipeline_bubble_fraction(stages, micro_batches) == pytest.approx(bubble)


def test_ddp_all_reduce_sends_2_n_minus_1_over_n_of_the_gradients() -> None:
    (reduce,) = estimate_communication(TrainingSetup(params=1e9, gpus=8, zero=0)).collectives
    assert (reduce.name, reduce.group_size, reduce.inter_node) == ("grad all-reduce", 8, False)
    assert reduce.bytes_sent_per_step == pytest.approx(2 * 7 / 8 * 2e9)


@pytest.mark.parametrize(("zero", "ratio"), [(1, 1.0), (2, 1.0), (3, 1.5)])
def test_zero_communication_relative_to_ddp(zero: int, ratio: float) -> None:
    ddp = estimate_communication(TrainingSetup(params=1e9, gpus=8, nodes=4, zero=0)).bytes_sent_per_step
    sharded = estimate_communication(TrainingSetup(params=1e9, gpus=8, nodes=4, zero=zero)).bytes_sent_per_step
    assert sharded / ddp == pytest.approx(ratio)


def test_zero3_gathers_parameters_for_every_micro_batch() -> None:
    comm = estimate_communication(TrainingSetup(params=1e9, gpus=8, zero=3, micro_batches=4))
    assert {c.name: c.calls_per_step for c in comm.collectives} == {
        "grad reduce-scatter": 4,
        "param all-gather": 8,
    }


def test_groups_that_span_nodes_use_the_inter_node_link() -> None:
    comm = estimate_communication(TrainingSetup(**MEGATRON))
    assert {c.group: c.inter_node for c in comm.collectives} == {"dp": True, "tp": False, "pp": True}
    tp = next(c for c in comm.collectives if c.group == "tp")
    assert (
        tp.calls_per_step == 96 // 4 * 4 * 64
    )  # 2 forward + 2 backward all-reduces per layer and micro-batch


@pytest.mark.parametrize(
    ("fields", "path", "fragment"),
    [
        (dict(params=7e9, zero=4), "zero", "must be one of 0, 1, 2, 3, got 4"),
        (dict(params=7e9, gpus=0), "gpus", "must be an integer >= 1, got 0"),
        (dict(params=7e9, dtype="int8"), "dtype", "must be one of bf16, fp16, fp32, got 'int8'"),
        (dict(params=7e9, optimizer="lion"), "optimizer", "adam, adamw, sgd"),
        (dict(params=7e9, gpus=8, nodes=2, tp=3), "tp", "try 1, 2, 4, 8 or 16"),
        (dict(params=7e9, offload=True), "offload", "needs zero >= 1"),
        (dict(gpus=8), "params", "layers and hidden"),
        (dict(layers=30, hidden=1024, pp=4, gpus=4), "layers", "divisible by pp (4)"),
        (dict(layers=32, hidden=1024, heads=12, tp=8, gpus=8), "heads", "divisible by tp (8)"),
        (
            dict(params=1e9, gpus=8, micro_batch=4, global_batch=100),
            "global_batch",
            "multiple of micro_batch × dp (32)",
        ),
    ],
)
def test_bad_setups_name_the_field_and_what_is_accepted(fields: dict, path: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as caught:
        TrainingSetup(**fields)
    assert caught.value.path == path
    assert fragment in caught.value.message


# The planner and the library share one rank layout (ParallelDims: TP innermost, then PP, DP outermost). On 2 nodes
# of 4 GPUs at tp=2, pp=2, dp=2 the library builds PP groups [0, 2] [1, 3] [4, 6] [5, 7] (inside a node) and DP
# groups [0, 4] [1, 5] [2, 6] [3, 7] (across nodes); a planner ordering ranks TP, DP, PP had these two swapped.
def test_which_groups_cross_nodes_follows_the_library_layout() -> None:
    setup = TrainingSetup(params=1e9, layers=4, hidden=256, heads=4, seq=128, gpus=4, nodes=2, tp=2, pp=2, zero=0)
    assert {g: setup.group_spans_nodes(g) for g in ("tp", "pp", "dp")} == {"tp": False, "pp": False, "dp": True}
    comm = estimate_communication(setup)
    assert {c.group: c.inter_node for c in comm.collectives} == {"dp": True, "tp": False, "pp": False}


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
def test_node_crossing_matches_parallel_dims_groups(gpus: int, nodes: int) -> None:
    from trainjob.torch.parallel import ParallelDims

    world = gpus * nodes
    for tp in (d for d in range(1, world + 1) if world % d == 0):
        for pp in (d for d in range(1, world // tp + 1) if world // tp % d == 0):
            setup = TrainingSetup(params=1e9, gpus=gpus, nodes=nodes, tp=tp, pp=pp)
            dims = ParallelDims(dp_shard=-1, tp=tp, pp=pp, world_size=world)
            for group in ("tp", "pp", "dp"):
                crosses = any(len({rank // gpus for rank in g}) > 1 for g in dims.groups(group))
                assert setup.group_spans_nodes(group) == crosses, (gpus, nodes, tp, pp, group)


def _crosses_nodes(groups: list[list[int]], gpus_per_node: int) -> bool:
    return any(len({rank // gpus_per_node for rank in group}) > 1 for group in groups)


# What `trainjob plan` prints per collective ("dp=2 inter", "pp=2 intra") is the link the estimate used; for every
# layout it is the placement of the process groups ParallelDims builds for training, group by group.
@pytest.mark.parametrize(("gpus", "nodes"), [(2, 2), (4, 2), (8, 2), (4, 4), (8, 4), (2, 8)])
def test_communication_links_follow_the_groups_parallel_dims_builds(gpus: int, nodes: int) -> None:
    from trainjob.torch.parallel import ParallelDims

    world = gpus * nodes
    checked = 0
    for tp in (d for d in range(1, world + 1) if world % d == 0):
        for pp in (d for d in range(1, world // tp + 1) if world // tp % d == 0):
            setup = TrainingSetup(params=1e9, layers=pp * 2, hidden=64 * tp, heads=tp, seq=64, gpus=gpus,
                                  nodes=nodes, tp=tp, pp=pp, zero=0)  # fmt: skip
            dims = ParallelDims(dp_shard=-1, tp=tp, pp=pp, world_size=world)
            placed = {c.group: c.inter_node for c in estimate_communication(setup).collectives}
            built = {group: _crosses_nodes(dims.groups(group), gpus) for group in placed}
            assert placed == built, (gpus, nodes, tp, pp)
            checked += len(placed)
    assert checked > 0
