"""A small gloo job standing in for the seeds' train.py: every rank adds its rank; rank 0 prints the sum.

Arguments after the script are ignored (the seeds pass --epochs, --config ...).
"""

import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        value = torch.tensor([float(rank)])
        dist.all_reduce(value)
        expected = world * (world - 1) / 2
        if value.item() != expected:
            raise SystemExit(f"all_reduce gave {value.item()}, expected {expected}")
        if rank == 0:
            print(f"allreduce ok world={world} nodes={os.environ.get('GROUP_WORLD_SIZE')}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
