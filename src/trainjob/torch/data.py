"""Shard a DataLoader across ranks, reshuffle it every epoch without being asked, and move batches to the device.

A ``DataLoader`` built for one process gives every rank the same data. :func:`prepare_data_loader` rebuilds it
with a :class:`~torch.utils.data.DistributedSampler` that keeps the loader's meaning:

=====================  =====================================================================================
loader had             the distributed loader
=====================  =====================================================================================
``shuffle=True``       a new permutation every epoch, the same on all ranks, each rank taking its share
``shuffle=False``      dataset order, dealt out round-robin: rank ``r`` gets items ``r, r+W, r+2W, ...``
``drop_last=True``     the tail that does not fill a batch on every rank is dropped
``drop_last=False``    the last samples are repeated so every rank runs the same number of steps
=====================  =====================================================================================

With tensor or pipeline parallelism (a model from :func:`trainjob.torch.parallel.parallelize`, or
``prepare_model(parallel=...)``) the data is sharded by *data-parallel* rank: the ranks of one tensor-parallel or
pipeline group hold one model replica and read the same batches. That happens without being asked, also for a
loader prepared before the model (it re-shards on its next iteration); ``rank=``/``world_size=`` override it.

Each ``for batch in loader`` is one epoch and calls ``sampler.set_epoch`` itself, so forgetting it (and training
every epoch on the same order) cannot happen. The loader's :meth:`~DistributedDataLoader.state_dict` records the
epoch and the samples already consumed, so a resumed run continues mid-epoch, also at another world size.
A resume point that is not a whole number of the new global batches (an elastic job that lost a node: 3 ranks
consumed 3 x 4 x k samples, 2 ranks now read 2 x 4 per step) is refused unless the loader is ``elastic`` (set by
``Checkpointer(elastic=...)``): the rest of the epoch's order after exactly the consumed samples is then dealt
out over the new ranks (:func:`remaining_shard`), so no sample is repeated or skipped::

    loader = prepare_data_loader(DataLoader(dataset, batch_size=32, shuffle=True))
    for epoch in range(epochs):
        for x, y in loader:          # already on the device
            ...
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, Sampler

from trainjob.errors import ValidationError
from trainjob.torch.data_layout import current_layout
from trainjob.torch.env import init
from trainjob.torch.seed import rank_seed

if TYPE_CHECKING:
    from trainjob.torch.parallel.dims import ParallelDims

__all__ = ["DistributedDataLoader", "move_to_device", "prepare_data_loader"]

# DataLoader settings carried over to the rebuilt loader; the sampler and batch_sampler are replaced.
_LOADER_SETTINGS = (
    "batch_size",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor moved to ``device``, through tuples, lists, dicts, namedtuples and dataclasses."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(move_to_device(v, device, non_blocking) for v in batch)
    if isinstance(batch, Mapping):
        return {k: move_to_device(v, device, non_blocking) for k, v in batch.items()}
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {f.name: move_to_device(getattr(batch, f.name), device, non_blocking) for f in dataclasses.fields(batch)}
        return dataclasses.replace(batch, **changes)
    return batch


def epoch_order(sampler: DistributedSampler, epoch: int) -> list[int]:
    """The global order of ``epoch`` that ``sampler`` deals out (rank ``r`` of ``W`` takes items ``r, r+W, ...``)."""
    size = len(sampler.dataset)  # type: ignore[arg-type]
    if sampler.shuffle:
        generator = torch.Generator()
        generator.manual_seed(sampler.seed + epoch)
        return torch.randperm(size, generator=generator).tolist()
    return list(range(size))


def remaining_shard(order: list[int], consumed: int, rank: int, world_size: int, drop_last: bool) -> list[int]:
    """Rank ``rank``'s share of what is left of ``order`` after its first ``consumed`` items, dealt out
    round-robin over ``world_size`` ranks; the tail is dropped (``drop_last``) or padded from the start of
    the rest so every rank gets as many::

    >>> remaining_shard(list(range(10)), 4, 0, 2, drop_last=False), remaining_shard(list(range(10)), 3, 1, 2, True)
    ([4, 6, 8], [4, 6])
    """
    rest = order[consumed:]
    if drop_last:
        rest = rest[: len(rest) - len(rest) % world_size]
    elif rest and len(rest) % world_size:
        padding = world_size - len(rest) % world_size
        rest += (rest * math.ceil(padding / len(rest)))[:padding]
    return rest[rank::world_size]


class _SkipFirst(Sampler[int]):
    """A sampler that starts ``skip`` items into its inner sampler's order (mid-epoch resume) and forwards
    set_epoch; with ``global_skip`` (a ``DistributedSampler`` inside) it deals out the epoch's order after that
    many samples instead."""

    def __init__(self, inner: Sampler[int]) -> None:
        self.inner = inner
        self.skip = 0
        self.global_skip = 0
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def _rest(self) -> list[int]:
        inner = self.inner
        assert isinstance(inner, DistributedSampler)
        order = epoch_order(inner, self.epoch)
        return remaining_shard(order, self.global_skip, inner.rank, inner.num_replicas, inner.drop_last)

    def __iter__(self) -> Iterator[int]:
        if self.global_skip:
            return iter(self._rest())
        return itertools.islice(iter(self.inner), self.skip, None)

    def __len__(self) -> int:
        if self.global_skip:
            return len(self._rest())
        return max(len(self.inner) - self.skip, 0)  # type: ignore[arg-type]


class DistributedDataLoader:
    """A DataLoader whose every iteration is one epoch of this rank's shard, with batches on ``device``.

    ``len(loader)`` is the number of batches per epoch on this rank; ``loader.epoch`` the epoch the next (or
    running) iteration covers. ``set_epoch`` jumps to an epoch; ``state_dict``/``load_state_dict`` make it
    checkpointable (``Checkpointer.save(step, model, optimizer, loader=loader)``).
    """

    def __init__(self, loader: DataLoader, device: torch.device, world_size: int) -> None:
        self.loader = loader
        self.device = device
        self.world_size = world_size  # data-parallel ranks sharing each global batch
        self.rank = 0  # this rank's data-parallel index
        # Set when the shard follows the data-parallel layout (no rank= given): rebuilt if the layout changes.
        self._reshard: Callable[[ParallelDims | None], tuple[DataLoader, int, int]] | None = None
        self._layout: ParallelDims | None = None
        self.epoch = 0
        self._batches_done = 0  # in the current epoch, on this rank
        self._resume_samples = 0  # global samples to skip at the start of the next iteration
        self._offset_samples = 0  # global samples of the running epoch consumed before this run's first batch
        #: Accept resume points that are not whole global batches (set by ``Checkpointer(elastic=...)``).
        self.elastic = False

    @property
    def sampler(self) -> Sampler[int]:
        """The sharding sampler (a ``DistributedSampler`` unless the loader was left unsharded)."""
        sampler = self.loader.sampler
        return sampler.inner if isinstance(sampler, _SkipFirst) else sampler

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    def __len__(self) -> int:
        self._follow_layout()
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration cover ``epoch`` (resume an epoch-counted loop)."""
        self.epoch = epoch
        self._batches_done = 0
        self._resume_samples = 0
        self._offset_samples = 0

    def _samples_per_batch(self) -> int:
        return (self.loader.batch_size or 1) * self.world_size

    def _follow_layout(self) -> None:
        """Re-shard if a model was parallelized since this loader was built (by data-parallel rank from then on)."""
        if self._reshard is None:
            return
        layout = current_layout()
        if layout is not self._layout:
            self.loader, self.rank, self.world_size = self._reshard(layout)
            self._layout = layout

    def __iter__(self) -> Iterator[Any]:
        self._follow_layout()
        sampler = self.loader.sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)
        skip_batches = self._resume_samples // self._samples_per_batch()
        partial = self._resume_samples % self._samples_per_batch()
        batches: Iterator[Any]
        if isinstance(sampler, _SkipFirst):
            sampler.global_skip = 0
        if partial and isinstance(sampler, _SkipFirst) and isinstance(sampler.inner, DistributedSampler):
            # Not a whole number of this world size's global batches: deal out exactly what is left.
            sampler.skip, sampler.global_skip = 0, self._resume_samples
            self._offset_samples, self._batches_done = self._resume_samples, 0
            batches = iter(self.loader)
        elif isinstance(sampler, _SkipFirst):  # skip indices, not loaded batches
            self._offset_samples, self._batches_done = 0, skip_batches
            sampler.skip = skip_batches * (self.loader.batch_size or 1)
            batches = iter(self.loader)
        else:
            self._offset_samples, self._batches_done = 0, skip_batches
            batches = itertools.islice(self.loader, skip_batches, None)
        self._resume_samples = 0
        non_blocking = self.loader.pin_memory and self.device.type == "cuda"
        for batch in batches:
            self._batches_done += 1
            yield move_to_device(batch, self.device, non_blocking)
        self.epoch += 1
        self._batches_done = 0
        self._offset_samples = 0
        if isinstance(sampler, _SkipFirst):
            sampler.global_skip = 0

    def state_dict(self) -> dict[str, int]:
        """Epoch and global samples consumed in it: enough to continue at the same or another world size."""
        samples = self._resume_samples + self._offset_samples + self._batches_done * self._samples_per_batch()
        return {"epoch": self.epoch, "samples_seen": samples}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue where ``state`` was taken: the next iteration resumes that epoch after its consumed samples."""
        samples = int(state["samples_seen"])
        exact = self.elastic and isinstance(self.loader.sampler, _SkipFirst)
        if samples % self._samples_per_batch() and not exact:
            raise ValidationError(
                "loader.samples_seen",
                f"{samples} samples are not a whole number of global batches of {self._samples_per_batch()} "
                f"(batch_size {self.loader.batch_size} x world size {self.world_size}); keep the global batch size "
                "when resuming at another world size, or checkpoint with Checkpointer(elastic=ElasticConfig()) "
                "to continue after exactly the samples consumed",
            )
        self.epoch = int(state["epoch"])
        self._batches_done = 0
        self._offset_samples = 0
        self._resume_samples = samples


def _shuffles(sampler: Sampler[int]) -> bool:
    return isinstance(sampler, RandomSampler)


def _data_parallel_position(layout: ParallelDims | None) -> tuple[int, int]:
    """This process's (data-parallel rank, data-parallel size) under ``layout``; all ranks when there is none."""
    ctx = init()
    if layout is None or layout.world_size != ctx.world_size:
        return ctx.rank, ctx.world_size
    return layout.coordinates(ctx.rank)["dp"], layout.dp


def prepare_data_loader(
    loader: DataLoader, *, seed: int = 0, shard: bool = True, rank: int | None = None, world_size: int | None = None
) -> DistributedDataLoader:
    """Rebuild ``loader`` to give this rank its shard (see the module docstring for what is kept).

    ``seed`` fixes the shuffle order (the same on every rank, different each epoch). A loader that already has
    a ``DistributedSampler`` keeps it. ``shard=False`` leaves the data as is (an ``IterableDataset`` that shards
    itself) and still moves batches and counts epochs. ``rank``/``world_size`` default to the data-parallel rank
    and size: the process group's, or, once a model is parallelized with tensor or pipeline parallelism, its
    data-parallel coordinates (so tensor-parallel peers get the same batches)::

        loader = prepare_data_loader(DataLoader(ds, batch_size=64, shuffle=True, drop_last=True))
    """
    follow = rank is None and world_size is None
    ctx = init() if rank is None or world_size is None else None
    device = ctx.device if ctx is not None else torch.device("cpu")
    if not shard:
        return DistributedDataLoader(loader, device, world_size=1)
    _check_shardable(loader)
    if follow:
        layout = current_layout()

        def reshard(new_layout: ParallelDims | None) -> tuple[DataLoader, int, int]:
            dp_rank, dp_size = _data_parallel_position(new_layout)
            return _sharded(loader, seed, dp_rank, dp_size), dp_rank, dp_size

        rebuilt, rank, world_size = reshard(layout)
        built = DistributedDataLoader(rebuilt, device, world_size)
        built.rank, built._layout, built._reshard = rank, layout, reshard
        return built
    assert ctx is not None or (rank is not None and world_size is not None)
    rank = ctx.rank if rank is None else rank  # type: ignore[union-attr]
    world_size = ctx.world_size if world_size is None else world_size  # type: ignore[union-attr]
    built = DistributedDataLoader(_sharded(loader, seed, rank, world_size), device, world_size)
    built.rank = rank
    return built


def _check_shardable(loader: DataLoader) -> None:
    if isinstance(loader.dataset, IterableDataset):
        raise ValidationError(
            "loader.dataset",
            f"an IterableDataset ({type(loader.dataset).__name__}) cannot be sharded by a sampler; shard it inside "
            "the dataset by rank and pass shard=False",
        )
    if loader.batch_size is None:
        raise ValidationError(
            "loader.batch_sampler",
            "a custom batch_sampler cannot be sharded; give the DataLoader batch_size= and a sampler, "
            "or a batch_sampler that shards by rank with shard=False",
        )
    if not isinstance(loader.sampler, DistributedSampler | RandomSampler | torch.utils.data.SequentialSampler):
        raise ValidationError(
            "loader.sampler",
            f"{type(loader.sampler).__name__} cannot be combined with sharding; use shuffle=True/False, "
            "a DistributedSampler, or shard=False",
        )


def _sharded(loader: DataLoader, seed: int, rank: int, world_size: int) -> DataLoader:
    """``loader`` rebuilt over this rank's shard, with its other settings kept."""
    settings = {name: getattr(loader, name) for name in _LOADER_SETTINGS if hasattr(loader, name)}
    if settings.get("num_workers", 0) == 0:
        settings.pop("prefetch_factor", None)
    # Unless the loader brought its own, a per-rank generator: workers' augmentation seeds differ across
    # data-parallel ranks (and agree within a tensor-parallel group, which must see identical inputs), and
    # iterating does not draw from the global generator (which model init and dropout use).
    generator = loader.generator or torch.Generator().manual_seed(rank_seed(seed, rank))
    if isinstance(loader.sampler, DistributedSampler):
        sampler: Sampler[int] = loader.sampler
    else:
        sampler = DistributedSampler(
            loader.dataset,
            num_replicas=world_size,
            rank=rank,
            shuffle=_shuffles(loader.sampler),
            seed=seed,
            drop_last=loader.drop_last,
        )
    return DataLoader(loader.dataset, sampler=_SkipFirst(sampler), generator=generator, **settings)
