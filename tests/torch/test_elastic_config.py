"""ElasticConfig's learning-rate scaling and the arithmetic of resharding data at another world size."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainjob.torch as tt
from trainjob.errors import ValidationError
from trainjob.torch.data import prepare_data_loader, remaining_shard
from trainjob.torch.elastic import lr_factor, scale_learning_rate


@pytest.mark.parametrize(
    ("scaling", "new", "old", "factor"),
    [("linear", 2, 3, 2 / 3), ("linear", 3, 2, 1.5), ("sqrt", 2, 8, 0.5), ("sqrt", 3, 2, math.sqrt(1.5)),
     (None, 2, 3, 1.0), ("linear", 4, 4, 1.0)],
)
def test_the_learning_rate_follows_the_world_size(scaling, new, old, factor):
    assert tt.ElasticConfig(lr_scaling=scaling).lr_factor(new, old) == pytest.approx(factor)


def test_scaling_down_and_back_up_restores_the_learning_rate():
    for scaling in ("linear", "sqrt"):
        there = lr_factor(scaling, 2, 3)
        back = lr_factor(scaling, 3, 2)
        assert there * back == pytest.approx(1.0)


def test_scaling_reaches_optimizer_groups_and_schedulers():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD([{"params": [model.weight], "lr": 0.3}, {"params": [model.bias], "lr": 0.6}])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scale_learning_rate(optimizer, 0.5, scheduler)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.15, 0.3])
    assert [g["initial_lr"] for g in optimizer.param_groups] == pytest.approx([0.15, 0.3])
    assert scheduler.base_lrs == pytest.approx([0.15, 0.3])
    optimizer.step()
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.15, 0.3]), "the scheduler keeps the scale"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"lr_scaling": "cubic"}, r"lr_scaling: must be one of 'linear', 'sqrt' or None, got 'cubic'"),
        ({"lr_scaling": "Linear"}, r"lr_scaling: must be one of 'linear', 'sqrt' or None, got 'Linear'"),
        ({"grow_wait_seconds": -1}, r"grow_wait_seconds: must be a number of seconds >= 0, got -1"),
        ({"grow_wait_seconds": "5"}, r"grow_wait_seconds: must be a number of seconds >= 0, got '5'"),
    ],
)
def test_bad_settings_are_refused_by_name(config, message):
    with pytest.raises(ValidationError, match=message):
        tt.ElasticConfig(**config)


@pytest.mark.parametrize(("new", "old"), [(0, 3), (2, -1), (2.5, 2), (True, 2)])
def test_world_sizes_must_be_positive_integers(new, old):
    with pytest.raises(ValidationError, match="world_size: must be an integer >= 1"):
        lr_factor("linear", new, old)


def test_a_checkpointer_takes_only_an_elastic_config():
    with pytest.raises(ValidationError, match="elastic: must be a trainjob.torch.ElasticConfig or None, got dict"):
        tt.Checkpointer("ckpt", elastic={"lr_scaling": "linear"})


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("consumed", [0, 7, 24, 25])
def test_what_is_left_is_dealt_out_exactly_once_over_the_new_ranks(world, consumed):
    order = list(range(40))
    shards = [remaining_shard(order, consumed, rank, world, drop_last=True) for rank in range(world)]
    dealt = [i for shard in shards for i in shard]
    assert len({len(shard) for shard in shards}) == 1, "every rank runs the same number of steps"
    assert len(dealt) == len(set(dealt)), "no sample twice"
    assert set(dealt) <= set(order[consumed:]) and len(order) - consumed - len(dealt) < world


def test_without_drop_last_the_tail_is_padded_from_what_is_left():
    shards = [remaining_shard(list(range(10)), 5, rank, 3, drop_last=False) for rank in range(3)]
    assert shards == [[5, 8], [6, 9], [7, 5]]


def _samples(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def test_an_elastic_loader_resumes_after_exactly_the_samples_three_ranks_consumed():
    """3 ranks x batch 4 consumed a step (12 samples); 2 ranks go on with the rest of the epoch, none repeated."""
    three = [prepare_data_loader(DataLoader(_samples(60), batch_size=4, shuffle=True, drop_last=True),
                                 rank=r, world_size=3) for r in range(3)]
    iterators = [iter(loader) for loader in three]
    seen = {int(i) for it in iterators for i in next(it)[0]}
    state = three[0].state_dict()
    assert state == {"epoch": 0, "samples_seen": 12}

    two = [prepare_data_loader(DataLoader(_samples(60), batch_size=4, shuffle=True, drop_last=True),
                               rank=r, world_size=2) for r in range(2)]
    with pytest.raises(ValidationError, match="12 samples are not a whole number of global batches of 8"):
        two[0].load_state_dict(state)
    for loader in two:
        loader.elastic = True
        loader.load_state_dict(state)
    iterators = [iter(loader) for loader in two]
    first = [next(it)[0] for it in iterators]
    assert two[0].state_dict() == {"epoch": 0, "samples_seen": 12 + 8}, "the position counts on from 12"
    rest = [int(i) for batch in first for i in batch] + [int(i) for it in iterators for (b,) in it for i in b]
    assert not seen & set(rest), "no sample of the epoch is seen twice"
    assert sorted(seen | set(rest)) == list(range(60)) and len(rest) == 48, "nor left out: 6 steps of 2 x 4"
    assert two[0].epoch == 1 and [len(list(loader)) for loader in two] == [7, 7], "the next epoch is whole again"
