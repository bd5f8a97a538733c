"""Runs inside run_distributed (4 processes): data loaders follow the data-parallel layout of a parallelized model."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import trainjob.torch as tt
from trainjob.torch.parallel import ParallelDims, PipelineConfig, parallelize
from trainjob.torch.parallel.gpt import GPT, GPTConfig, lm_loss

CONFIG = GPTConfig(vocab_size=32, max_seq_len=8, dim=16, n_heads=4, n_layers=4)
SEQ = 8


class Sequences(Dataset):
    """Fixed random token sequences; each item carries its index, to see which rank read what."""

    def __init__(self, size: int) -> None:
        self.tokens = torch.randint(0, CONFIG.vocab_size, (size, SEQ + 1), generator=torch.Generator().manual_seed(3))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.tokens[i, :-1], self.tokens[i, 1:]


def _epoch(loader: Any, train: Any = None) -> dict[str, Any]:
    """One epoch of this rank's indices (and losses when ``train`` is given), gathered from every rank."""
    indices, losses = [], []
    for idx, x, y in loader:
        indices.append(idx.tolist())
        if train is not None:
            losses.append(train(x, y))
    mine = {"indices": indices, "losses": losses, "rank": loader.rank, "world_size": loader.world_size}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {"ranks": everyone}


def _trainer(model: Any) -> Any:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        loss = model.train_step(x, y)
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    return step


def _reference_losses(dataset: Sequences, epoch: dict[str, Any], replica_leaders: list[int]) -> list[float]:
    """One process, no parallelism, trained on each step's global batch (the replicas' batches concatenated)."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    steps = zip(*(epoch["ranks"][leader]["indices"] for leader in replica_leaders), strict=True)
    for batches in steps:
        rows = [i for batch in batches for i in batch]
        loss = lm_loss(model(dataset.tokens[rows, :-1]), dataset.tokens[rows, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG)


def run_all() -> dict[str, Any]:
    tt.init()
    dataset = Sequences(32)

    def fresh_loader() -> DataLoader:
        return DataLoader(dataset, batch_size=2, shuffle=True, drop_last=True)

    early = tt.prepare_data_loader(fresh_loader(), seed=5)  # built before any model: 4 data-parallel ranks
    results = {"before_any_model": _epoch(early)}

    tp = parallelize(_model(), ParallelDims(dp_shard=2, tp=2))
    results["tp2_dp2"] = _epoch(tt.prepare_data_loader(fresh_loader(), seed=5), _trainer(tp))
    results["tp2_dp2"]["reference_losses"] = _reference_losses(dataset, results["tp2_dp2"], [0, 2])
    results["tp2_dp2_loader_built_before_the_model"] = _epoch(early)

    pp = parallelize(_model(), ParallelDims(dp_shard=2, pp=2), pipeline=PipelineConfig("GPipe", microbatches=2))
    results["pp2_dp2"] = _epoch(tt.prepare_data_loader(fresh_loader(), seed=5), _trainer(pp))
    results["pp2_dp2"]["reference_losses"] = _reference_losses(dataset, results["pp2_dp2"], [0, 2])
    results["explicit_rank_wins"] = _epoch(tt.prepare_data_loader(fresh_loader(), seed=5, rank=0, world_size=1))

    tt.prepare_model(torch.nn.Linear(2, 2), "ddp")  # a plain data-parallel model: every rank is a replica again
    results["after_prepare_model_ddp"] = _epoch(tt.prepare_data_loader(fresh_loader(), seed=5))
    return results
