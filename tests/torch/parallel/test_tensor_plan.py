import pytest
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from trainjob.errors import ValidationError
from trainjob.torch.parallel import check_tp_plan, transformer_plan
from trainjob.torch.parallel.gpt import GPT, GPTConfig


def test_transformer_plan_splits_qkv_and_up_by_columns_and_output_and_down_by_rows():
    plan = transformer_plan()
    colwise = sorted(k for k, v in plan.items() if isinstance(v, ColwiseParallel))
    rowwise = sorted(k for k, v in plan.items() if isinstance(v, RowwiseParallel))
    assert colwise == ["head", "layers.*.attn.wk", "layers.*.attn.wq", "layers.*.attn.wv", "layers.*.ffn.up"]
    assert rowwise == ["layers.*.attn.wo", "layers.*.ffn.down"]


def test_sequence_parallel_plan_runs_the_norms_on_sequence_shards():
    plan = transformer_plan(sequence_parallel=True)
    assert sorted(k for k, v in plan.items() if isinstance(v, SequenceParallel)) == [
        "layers.*.attn_norm",
        "layers.*.ffn_norm",
        "norm",
    ]


def test_the_plan_matches_every_linear_layer_of_the_gpt():
    model = GPT(GPTConfig(n_layers=2))
    present = check_tp_plan(model, transformer_plan(), tp=2)
    assert set(present) == set(transformer_plan())


@pytest.mark.parametrize(
    ("config", "tp", "messages"),
    [
        (
            GPTConfig(dim=16, n_heads=4, n_layers=1),
            3,
            [
                "parallel.tp: 3 does not divide layers.0.attn.n_heads=4 (the attention head count); tp must be one of [1, 2, 4]"
            ],
        ),
        (
            GPTConfig(dim=16, n_heads=4, n_layers=1, ffn_dim=18),
            4,
            [
                "parallel.tp: 4 does not divide layers.0.ffn.up.out_features=18 (what ColwiseParallel splits)",
                "parallel.tp: 4 does not divide layers.0.ffn.down.in_features=18 (what RowwiseParallel splits)",
            ],
        ),
        (
            GPTConfig(vocab_size=30, dim=16, n_heads=4, n_layers=1),
            4,
            ["parallel.tp: 4 does not divide head.out_features=30"],
        ),
    ],
)
def test_a_tp_degree_that_does_not_divide_heads_or_hidden_sizes_names_the_layer(config, tp, messages):
    with pytest.raises(ValidationError) as info:
        check_tp_plan(GPT(config), transformer_plan(), tp)
    for message in messages:
        assert message in str(info.value)


def test_the_same_sizes_pass_at_a_degree_that_divides_them():
    check_tp_plan(GPT(GPTConfig(dim=16, n_heads=4, n_layers=1, ffn_dim=18)), transformer_plan(), tp=2)


def test_a_plan_entry_that_matches_nothing_is_an_error():
    with pytest.raises(ValidationError, match=r"tp_plan\['layers.\*.attn.qkv'\]: matches no module of GPT"):
        check_tp_plan(GPT(GPTConfig(n_layers=1)), {"layers.*.attn.qkv": ColwiseParallel()}, tp=2)


def test_entries_for_pieces_another_pipeline_stage_holds_are_skipped():
    model = GPT(GPTConfig(n_layers=1))
    model.head = None
    assert "head" not in check_tp_plan(model, transformer_plan(), tp=2)


def test_any_module_can_be_given_a_plan():
    mlp = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 8))
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    assert check_tp_plan(mlp, plan, tp=4) == plan
    with pytest.raises(ValidationError, match=r"5 does not divide 0.out_features=12"):
        check_tp_plan(mlp, plan, tp=5)
