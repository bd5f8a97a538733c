"""prepare_data_loader: sharding, shuffle and drop_last meaning, automatic set_epoch, resume, device moves."""

from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

from trainjob.errors import ValidationError
from trainjob.torch.data import move_to_device, prepare_data_loader


def _dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def _indices(loader) -> list[int]:
    return [int(i) for (batch,) in loader for i in batch]


def _shards(n: int, world_size: int, **loader_kwargs) -> list[list[int]]:
    return [
        _indices(prepare_data_loader(DataLoader(_dataset(n), **loader_kwargs), rank=r, world_size=world_size))
        for r in range(world_size)
    ]


def test_without_shuffle_ranks_take_turns_in_dataset_order():
    assert _shards(8, 2, batch_size=2) == [[0, 2, 4, 6], [1, 3, 5, 7]]


@pytest.mark.parametrize(
    ("drop_last", "per_rank_batches", "samples"),
    [
        (False, [[2, 1]] * 4, 12),  # 10 samples padded to 12: every rank runs the same number of steps
        (True, [[2]] * 4, 8),  # the tail that cannot fill a batch on every rank is dropped
    ],
)
def test_drop_last_keeps_its_meaning(drop_last, per_rank_batches, samples):
    loaders = [
        prepare_data_loader(DataLoader(_dataset(10), batch_size=2, drop_last=drop_last), rank=r, world_size=4)
        for r in range(4)
    ]
    assert [[len(b) for (b,) in loader] for loader in loaders] == per_rank_batches
    assert sum(len(_indices(loader)) for loader in loaders) == samples


def test_shuffled_shards_partition_the_dataset_and_reshuffle_each_epoch_without_set_epoch():
    loaders = [
        prepare_data_loader(DataLoader(_dataset(16), batch_size=4, shuffle=True), rank=r, world_size=2, seed=3)
        for r in range(2)
    ]
    epoch0 = [_indices(loader) for loader in loaders]
    epoch1 = [_indices(loader) for loader in loaders]
    assert sorted(epoch0[0] + epoch0[1]) == list(range(16))
    assert sorted(epoch1[0] + epoch1[1]) == list(range(16))
    assert epoch0 != epoch1
    assert [loader.epoch for loader in loaders] == [2, 2]
    assert epoch0[0] != list(range(0, 16, 2)), "shuffle=True was lost"


def test_the_same_seed_gives_the_same_order_in_a_new_run():
    def first_epoch() -> list[int]:
        return _indices(prepare_data_loader(DataLoader(_dataset(16), batch_size=4, shuffle=True), rank=1, world_size=2))

    assert first_epoch() == first_epoch()


def test_an_existing_distributed_sampler_is_kept():
    sampler = DistributedSampler(_dataset(8), num_replicas=2, rank=1, shuffle=False)
    loader = prepare_data_loader(DataLoader(_dataset(8), batch_size=2, sampler=sampler), rank=1, world_size=2)
    assert loader.sampler is sampler
    assert _indices(loader) == [1, 3, 5, 7]


def test_resuming_mid_epoch_continues_with_the_remaining_batches():
    def make():
        return prepare_data_loader(DataLoader(_dataset(24), batch_size=3, shuffle=True), rank=0, world_size=2)

    original = make()
    _indices(original)  # epoch 0
    iterator = iter(original)
    consumed = [next(iterator)[0].tolist() for _ in range(2)]
    state = original.state_dict()
    assert state == {"epoch": 1, "samples_seen": 2 * 3 * 2}
    rest = [b.tolist() for (b,) in iterator]

    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert [b.tolist() for (b,) in resumed] == rest
    assert consumed and resumed.epoch == 2


def test_resuming_at_another_world_size_with_the_same_global_batch_skips_exactly_the_seen_samples():
    four = [prepare_data_loader(DataLoader(_dataset(32), batch_size=2, shuffle=True), rank=r, world_size=4) for r in range(4)]
    iterators = [iter(loader) for loader in four]
    seen = {int(i) for it in iterators for _ in range(2) for i in next(it)[0]}  # 2 steps of 8 samples
    state = four[0].state_dict()
    two = [prepare_data_loader(DataLoader(_dataset(32), batch_size=4, shuffle=True), rank=r, world_size=2) for r in range(2)]
    for loader in two:
        loader.load_state_dict(state)
    rest = [i for loader in two for i in _indices(loader)]
    assert len(seen) == 16
    assert sorted(rest) == sorted(set(range(32)) - seen)


def test_a_resume_point_that_is_not_a_whole_global_batch_is_refused():
    loader = prepare_data_loader(DataLoader(_dataset(32), batch_size=4), rank=0, world_size=2)
    with pytest.raises(ValidationError, match=r"loader.samples_seen: 12 samples .* global batches of 8"):
        loader.load_state_dict({"epoch": 0, "samples_seen": 12})


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


@pytest.mark.parametrize(
    ("loader", "message"),
    [
        (DataLoader(_Stream(), batch_size=2), r"loader.dataset: an IterableDataset \(_Stream\) cannot be sharded"),
        (
            DataLoader(_dataset(8), batch_sampler=[[0, 1], [2, 3]]),
            r"loader.batch_sampler: a custom batch_sampler cannot be sharded",
        ),
        (
            DataLoader(_dataset(8), sampler=torch.utils.data.WeightedRandomSampler([1.0] * 8, 8)),
            r"loader.sampler: WeightedRandomSampler cannot be combined with sharding",
        ),
    ],
    ids=["iterable", "batch_sampler", "custom_sampler"],
)
def test_loaders_that_cannot_be_sharded_are_refused_with_the_way_out(loader, message):
    with pytest.raises(ValidationError, match=message):
        prepare_data_loader(loader, rank=0, world_size=2)


def test_shard_false_leaves_an_iterable_dataset_alone_but_still_counts_epochs():
    loader = prepare_data_loader(DataLoader(_Stream(), batch_size=2), shard=False, rank=0, world_size=2)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    assert loader.epoch == 1


Pair = namedtuple("Pair", "x y")


@dataclass
class Batch:
    tokens: torch.Tensor
    name: str


def test_move_to_device_reaches_into_containers():
    meta = torch.device("meta")
    moved = move_to_device({"pair": Pair(torch.ones(1), [torch.zeros(2)]), "batch": Batch(torch.ones(3), "b"), "n": 3}, meta)
    assert moved["pair"].x.device == meta and moved["pair"].y[0].device == meta
    assert isinstance(moved["pair"], Pair)
    assert moved["batch"].tokens.device == meta and moved["batch"].name == "b"
    assert moved["n"] == 3
