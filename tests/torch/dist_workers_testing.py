"""Functions run inside the processes started by trainjob.torch.testing.run_distributed (see its tests)."""

from __future__ import annotations

import os


def all_reduce_rank_sum() -> dict[str, float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(), "env_rank": os.environ["RANK"]}


def fail_on_rank(rank: int) -> None:
    import torch.distributed as dist

    if dist.get_rank() == rank:
        raise ValueError(f"rank {rank} fails on purpose")


def hang_on_rank(rank: int) -> None:
    """``rank`` never joins the collective the others wait in."""
    import time

    import torch
    import torch.distributed as dist

    if dist.get_rank() == rank:
        time.sleep(3600)
    dist.all_reduce(torch.zeros(1))
