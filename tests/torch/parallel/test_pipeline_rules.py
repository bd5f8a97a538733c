import re

import pytest
import torch

from trainjob.errors import ValidationError
from trainjob.torch.parallel import SCHEDULES, PipelineConfig, check_microbatches, split_layers
from trainjob.torch.parallel.gpt import GPT, GPTConfig
from trainjob.torch.parallel.stages import build_stage_modules, meta_copy, stage_to_rank, stage_view


def test_every_schedule_pytorch_ships_is_offered():
    import torch.distributed.pipelining as pipelining

    shipped = {name.removeprefix("Schedule") for name in dir(pipelining) if name.startswith("Schedule")}
    assert shipped == set(SCHEDULES)


@pytest.mark.parametrize(
    ("schedule", "microbatches", "pp", "stages", "error"),
    [
        ("GPipe", 1, 2, 2, None),
        ("1F1B", 2, 2, 2, None),
        ("1F1B", 1, 2, 2, "1F1B needs at least as many micro-batches as stages (2), got 1"),
        ("Interleaved1F1B", 3, 4, 8, None),
        ("Interleaved1F1B", 8, 4, 8, None),
        ("Interleaved1F1B", 10, 4, 8, None),
        ("Interleaved1F1B", 5, 2, 4, "5 is not a multiple of 2 rounds; use a multiple of 2 such as 4"),
        ("InterleavedZeroBubble", 7, 2, 4, "7 is not a multiple of 3 rounds; use a multiple of 2 such as 6"),
        ("ZBVZeroBubble", 1, 2, 4, None),
        ("DualPipeV", 3, 2, 4, "DualPipeV needs at least as many micro-batches as stages (4), got 3"),
        ("GPipe", 0, 2, 2, "must be >= 1, got 0"),
    ],
)
def test_microbatch_counts_are_checked_against_each_schedules_rule(schedule, microbatches, pp, stages, error):
    if error is None:
        check_microbatches(schedule, microbatches, pp, stages)
    else:
        with pytest.raises(ValidationError, match=f"^pipeline.microbatches: .*{re.escape(error)}"):
            check_microbatches(schedule, microbatches, pp, stages)


@pytest.mark.parametrize(
    ("config", "error"),
    [
        (PipelineConfig(schedule="Zigzag"), "pipeline.schedule: must be one of GPipe, 1F1B, "),
        (PipelineConfig(schedule="1F1B", stages_per_rank=2), "1F1B runs 1 stage per rank, got 2"),
        (
            PipelineConfig(schedule="ZBVZeroBubble", stages_per_rank=3),
            "ZBVZeroBubble runs 2 stages per rank, got 3",
        ),
    ],
)
def test_stages_per_rank_must_suit_the_schedule(config, error):
    with pytest.raises(ValidationError, match=re.escape(error)):
        config.resolved_stages_per_rank()


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("ZBVZeroBubble", 2), ("DualPipeV", 2)],
)
def test_stages_per_rank_default(schedule, expected):
    assert PipelineConfig(schedule=schedule).resolved_stages_per_rank() == expected


@pytest.mark.parametrize(
    ("n_layers", "stages", "split_points", "expected"),
    [
        (4, 2, None, [["0", "1"], ["2", "3"]]),
        (5, 2, None, [["0", "1", "2"], ["3", "4"]]),
        (7, 3, None, [["0", "1", "2"], ["3", "4"], ["5", "6"]]),
        (4, 4, None, [["0"], ["1"], ["2"], ["3"]]),
        (6, 2, ["layers.1"], [["0"], ["1", "2", "3", "4", "5"]]),
        (6, 3, ["layers.2", "layers.5"], [["0", "1"], ["2", "3", "4"], ["5"]]),
    ],
)
def test_layers_are_split_evenly_or_at_named_points(n_layers, stages, split_points, expected):
    assert split_layers([str(i) for i in range(n_layers)], stages, split_points) == expected


@pytest.mark.parametrize(
    ("n_layers", "stages", "split_points", "error"),
    [
        (2, 4, None, "2 layers cannot fill 4 stages; lower pp or stages_per_rank"),
        (4, 2, ["layers.9"], "pipeline.split_points['layers.9']: is not a layer"),
        (4, 3, ["layers.2"], "need 2 increasing layer names after the first layer for 3 stages"),
        (4, 3, ["layers.3", "layers.2"], "need 2 increasing layer names"),
        (4, 2, ["layers.0"], "need 1 increasing layer names after the first layer"),
    ],
)
def test_impossible_splits_are_refused(n_layers, stages, split_points, error):
    with pytest.raises(ValidationError, match=re.escape(error)):
        split_layers([str(i) for i in range(n_layers)], stages, split_points)


def test_loop_placement_deals_stages_round_robin_and_v_placement_goes_there_and_back():
    assert stage_to_rank(8, 4, "loop") == [0, 1, 2, 3, 0, 1, 2, 3]
    assert stage_to_rank(8, 4, "v") == [0, 1, 2, 3, 3, 2, 1, 0]


def test_stage_views_keep_original_names_share_parameters_and_chain_to_the_full_model():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layers=3))
    layers = split_layers(list(model.layers.keys()), 2)
    first = stage_view(model, layers[0], first=True, last=False)
    last = stage_view(model, layers[1], first=False, last=True)
    assert [name for name, _ in first.named_children()] == ["embed", "layers"]
    assert first.norm is None and first.head is None and last.embed is None
    assert sorted([*first.state_dict(), *last.state_dict()]) == sorted(model.state_dict())
    assert first.layers["0"].attn.wq.weight is model.layers["0"].attn.wq.weight
    tokens = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(last(first(tokens)), model(tokens), rtol=0, atol=0)


def test_a_model_without_a_layers_dict_cannot_be_staged():
    with pytest.raises(
        ValidationError, match="model.layers: Sequential needs its blocks in an nn.ModuleDict 'layers'"
    ):
        stage_view(torch.nn.Sequential(torch.nn.Linear(2, 2)), [], first=True, last=False)


def test_the_shape_copy_lives_on_the_meta_device_and_leaves_the_model_alone():
    model = GPT(GPTConfig(n_layers=2))
    shadow = meta_copy(model)
    assert all(p.is_meta for p in shadow.parameters())
    assert not any(p.is_meta for p in model.parameters())
    assert shadow(torch.zeros(3, 5, dtype=torch.long, device="meta")).shape == (3, 5, 256)


@pytest.mark.parametrize(
    ("pp_rank", "style", "indices", "layers"),
    [
        (0, "loop", [0, 2], ["0", "1", "4"]),
        (1, "loop", [1, 3], ["2", "3", "5"]),
        (0, "v", [0, 3], ["0", "1", "5"]),
    ],
)
def test_each_rank_builds_only_its_own_stages(pp_rank, style, indices, layers):
    model = GPT(GPTConfig(n_layers=6))
    parts, got, stage_layers = build_stage_modules(
        model, pp=2, pp_rank=pp_rank, stages_per_rank=2, style=style
    )
    assert got == indices
    assert stage_layers == [["0", "1"], ["2", "3"], ["4"], ["5"]]
    assert [name for part in parts for name in part.layers] == layers
    assert (parts[0].embed is not None) == (0 in indices)
    assert (parts[-1].head is not None) == (3 in indices)
