"""Seeding for data-parallel jobs: the same weights on every rank, different augmentation on each.

Seeding every rank with ``seed + rank`` (a common recipe) gives each rank different initial weights: DDP hides
it by broadcasting rank 0's, FSDP does not and trains a model no rank ever agreed on. So:

* torch's global generator (weight init, dropout) gets ``seed`` on every rank;
* Python's ``random``, NumPy's global generator and the returned ``torch.Generator`` get a per-rank seed, for
  augmentation; ``prepare_data_loader`` gives DataLoader workers per-rank seeds too.

::

    aug = seed_everything(1234)
    noise = torch.randn(x.shape, generator=aug)
"""

from __future__ import annotations

import random

import torch

from trainjob.torch.env import global_rank

__all__ = ["capture_rng_state", "rank_seed", "restore_rng_state", "seed_everything"]

_PER_RANK_STRIDE = 1_000_003  # a prime, so nearby seeds on nearby ranks do not collide


def rank_seed(seed: int, rank: int | None = None) -> int:
    """The per-rank seed derived from ``seed``: distinct for every rank, stable across runs."""
    rank = global_rank() if rank is None else rank
    return (seed + _PER_RANK_STRIDE * (rank + 1)) % (2**63)


def seed_everything(seed: int) -> torch.Generator:
    """Seed torch with ``seed`` (same on all ranks) and Python/NumPy per rank; return a per-rank generator."""
    torch.manual_seed(seed)  # also seeds every CUDA device
    per_rank = rank_seed(seed)
    random.seed(per_rank)
    try:
        import numpy as np

        np.random.seed(per_rank % 2**32)
    except ImportError:  # pragma: no cover - numpy is a dependency, but optional for torch
        pass
    return torch.Generator().manual_seed(per_rank)


def capture_rng_state() -> dict[str, torch.Tensor]:
    """Every global generator's state (torch CPU and CUDA, Python, NumPy) as tensors, for checkpoints.

    Tensors only, of fixed shapes, so a checkpoint can load them in place and never needs to unpickle.
    """
    version, mt, gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "python_mt": torch.tensor(mt, dtype=torch.int64),
        "python_gauss": torch.tensor([float("nan") if gauss is None else gauss], dtype=torch.float64),
        "python_version": torch.tensor([version], dtype=torch.int64),
    }
    if torch.cuda.is_available():
        for index, cuda_state in enumerate(torch.cuda.get_rng_state_all()):
            state[f"cuda{index}"] = cuda_state
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return state
    _, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy_keys"] = torch.from_numpy(keys.astype(np.int64))
    state["numpy_pos"] = torch.tensor([pos, has_gauss], dtype=torch.int64)
    state["numpy_gauss"] = torch.tensor([cached], dtype=torch.float64)
    return state


def restore_rng_state(state: dict[str, torch.Tensor]) -> None:
    """Put back what :func:`capture_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    gauss = state["python_gauss"].item()
    random.setstate(
        (int(state["python_version"].item()), tuple(state["python_mt"].tolist()), None if gauss != gauss else gauss)
    )
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            if f"cuda{index}" in state:
                torch.cuda.set_rng_state(state[f"cuda{index}"], index)
    if "numpy_keys" in state:
        import numpy as np

        pos, has_gauss = state["numpy_pos"].tolist()
        keys = state["numpy_keys"].numpy().astype(np.uint32)
        np.random.set_state(("MT19937", keys, pos, has_gauss, state["numpy_gauss"].item()))
