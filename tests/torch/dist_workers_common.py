"""Model, data and helpers shared by the worker modules that run inside run_distributed processes."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader, Dataset

FEATURES = 16
CLASSES = 4


class Block(nn.Module):
    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(torch.tanh(self.linear(x)))


class Net(nn.Module):
    def __init__(self, depth: int = 3, dropout: float = 0.0) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(FEATURES, dropout) for _ in range(depth))
        self.head = nn.Linear(FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Indexed(Dataset):
    """Fixed random classification data whose items carry their own index, to see who got what."""

    def __init__(self, size: int, seed: int = 7) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, FEATURES, generator=gen)
        self.y = torch.randint(0, CLASSES, (size,), generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


def loader(dataset: Indexed, local_batch: int, shuffle: bool = True) -> DataLoader:
    return DataLoader(dataset, batch_size=local_batch, shuffle=shuffle, drop_last=True)


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded copies of every parameter (collective under FSDP), with plain names."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().clone().cpu() for k, v in state.items()}


def gather_indices(idx: torch.Tensor) -> list[int]:
    """Every rank's sample indices of this step, concatenated in rank order (collective)."""
    parts: list[list[int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, idx.tolist())
    return [i for part in parts for i in part]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max((a[k] - b[k]).abs().max().item() for k in a)
