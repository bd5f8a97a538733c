"""prepare_model, block selection, mixed precision, accumulation and clipping in one process (a group of one)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trainjob.torch as tt
from trainjob.errors import ValidationError
from trainjob.torch.precision import autocast_forward, precision_dtype


class Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _names(model: nn.Module, blocks: list[nn.Module]) -> list[str]:
    by_id = {id(m): name for name, m in model.named_modules()}
    return [by_id[id(b)] for b in blocks]


@pytest.mark.parametrize(
    ("wrap", "expected"),
    [
        (None, ["blocks.2", "blocks.1", "blocks.0"]),  # elements of ModuleLists, innermost-first order
        (Block, ["blocks.2", "blocks.1", "blocks.0"]),
        ((Block, nn.Linear), ["head", "blocks.2.linear", "blocks.2", "blocks.1.linear", "blocks.1", "blocks.0.linear", "blocks.0", "stem"]),
        (lambda m: m.__class__ is nn.Linear and m.out_features == 2, ["head"]),
        (72, ["blocks.0.linear", "blocks.1.linear", "blocks.2.linear"]),  # 8*8+8 parameters each
        (100, ["blocks"]),  # no single block reaches 100; the list of three (216) does
    ],
    ids=["default", "class", "classes", "predicate", "count_72", "count_100"],
)
def test_blocks_are_chosen_by_wrap(wrap, expected):
    model = Net()
    assert _names(model, tt.select_blocks(model, wrap)) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "zero3"}, r"strategy: must be one of 'ddp', 'fsdp', 'none', got 'zero3'"),
        ({"strategy": "ddp", "cpu_offload": True}, r"cpu_offload: needs strategy='fsdp', got strategy='ddp'"),
        ({"mixed_precision": "fp8"}, r"mixed_precision: must be one of None, 'bf16', 'fp16', got 'fp8'"),
        ({"wrap": 0}, r"wrap: a parameter count must be >= 1, got 0"),
        ({"wrap": "Block"}, r"wrap: must be a module class, a parameter count, a predicate or None, got 'Block'"),
        ({"strategy": "fsdp", "parallel": object()}, r"strategy: leave it out when parallel= is given, got 'fsdp'"),
        ({"activation_checkpointing": True, "wrap": lambda m: False}, r"activation_checkpointing: no block to checkpoint"),
        ({"parallel": object(), "wrap": Block}, r"wrap: parallelize shards the blocks in model.layers"),
        ({"zero_stage": 2}, r"zero_stage: is an option of parallelize: it needs parallel=ParallelDims\(...\)"),
        ({"pipelines": None}, r"pipelines: is not an option of prepare_model; with parallel= it also accepts .*pipeline, "),
    ],
)
def test_bad_arguments_name_the_setting_and_what_is_accepted(single_process, kwargs, message):
    with pytest.raises(ValidationError, match=message):
        tt.prepare_model(Net(), **kwargs)


def test_ddp_in_a_job_of_one_process_leaves_the_model_unwrapped(single_process):
    model = Net()
    assert tt.prepare_model(model, "ddp") is model


@pytest.mark.parametrize("cpu_offload", [False, True], ids=["on_device", "cpu_offload"])
def test_fsdp_in_a_group_of_one_trains_like_the_plain_model(single_process, cpu_offload):
    torch.manual_seed(0)
    plain = Net()
    sharded = tt.prepare_model(copy.deepcopy(plain), "fsdp", cpu_offload=cpu_offload)
    assert isinstance(sharded, torch.distributed.fsdp.FSDPModule)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 0, 1, 1, 0])
    for model in (plain, sharded):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    got = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
    for name, tensor in plain.state_dict().items():
        torch.testing.assert_close(got[name], tensor)


def test_activation_checkpointing_keeps_parameter_names_and_gradients(single_process):
    torch.manual_seed(0)
    plain = Net()
    checkpointed = tt.prepare_model(copy.deepcopy(plain), "none", activation_checkpointing=True)
    assert type(checkpointed.blocks[0]).__name__ == "CheckpointWrapper"
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    x = torch.randn(5, 4)
    for model in (plain, checkpointed):
        model(x).square().sum().backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_autocast_forward_computes_in_bf16_and_returns_float32():
    model = Net()
    seen = []
    model.head.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    autocast_forward(model, "bf16", "cpu")
    out = model(torch.randn(2, 4))
    assert seen == [torch.bfloat16]
    assert out.dtype == torch.float32
    assert list(model.state_dict()) == list(Net().state_dict())


@pytest.mark.parametrize(("precision", "dtype", "scaling"), [(None, None, False), ("bf16", torch.bfloat16, False), ("fp16", torch.float16, True)])
def test_only_fp16_gets_an_enabled_grad_scaler(precision, dtype, scaling):
    assert precision_dtype(precision) is dtype
    assert tt.grad_scaler(precision, "cpu").is_enabled() is scaling


def test_fp16_grad_scaler_skips_a_step_whose_gradients_overflowed():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = tt.grad_scaler("fp16", "cpu")
    before = model.weight.detach().clone()
    with tt.autocast("fp16", "cpu"):
        loss = model(torch.tensor([[1e30, 1.0]])).float().sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(model.weight, before)
    assert scaler.get_scale() < 65536.0


@pytest.mark.parametrize(("micro_steps", "last"), [(1, [True] * 4), (2, [False, True, False, True]), (3, [False, False, True, False])])
def test_accumulation_steps_the_optimizer_on_every_nth_micro_step(micro_steps, last):
    accumulation = tt.GradientAccumulation(nn.Linear(1, 1), micro_steps)
    got = []
    for i in range(4):
        with accumulation.micro_step(i) as is_last:
            got.append(is_last)
    assert got == last


@pytest.mark.parametrize("micro_steps", [0, 1.5, True])
def test_accumulation_needs_a_positive_integer(micro_steps):
    with pytest.raises(ValidationError, match=r"micro_steps: must be an integer >= 1"):
        tt.GradientAccumulation(nn.Linear(1, 1), micro_steps)


def test_clipping_a_plain_model_matches_torch():
    torch.manual_seed(0)
    ours, theirs = Net(), Net()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(4, 4)
    for model in (ours, theirs):
        model(x).sum().backward()
    norm = tt.clip_grad_norm_(ours, 0.1)
    expected = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.1)
    torch.testing.assert_close(norm, expected)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def _gpt() -> nn.Module:
    from trainjob.torch.parallel.gpt import GPT, GPTConfig

    return GPT(GPTConfig(vocab_size=32, max_seq_len=8, dim=16, n_heads=2, n_layers=2))


def test_parallel_hands_the_model_to_the_parallel_package(single_process):
    from trainjob.torch.parallel import ParallelDims, ParallelModel

    assert isinstance(tt.prepare_model(_gpt(), parallel=ParallelDims(dp_shard=1)), ParallelModel)


def test_parallel_options_reach_parallelize(single_process):
    from trainjob.torch.parallel import ParallelDims

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, 1), targets.flatten())

    model = tt.prepare_model(_gpt(), parallel=ParallelDims(dp_shard=1), zero_stage=2, loss_fn=loss_fn)
    assert model.loss_fn is loss_fn
    with pytest.raises(ValidationError, match=r"zero_stage: mixed_precision and cpu_offload need FSDP"):
        tt.prepare_model(_gpt(), parallel=ParallelDims(dp_shard=1), zero_stage=0, mixed_precision="bf16")
