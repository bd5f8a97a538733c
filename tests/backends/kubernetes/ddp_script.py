"""A small DDP training run by the test cluster's pods under torchrun (gloo, CPU).

Every rank prints ``rank R/W node N host H``; rank 0 prints ``final loss L``. Options make the failures the tests
need: ``--fail-rank R`` raises ``NameError`` on rank R after the first all-reduce (``--noise-lines N`` buries the
traceback under N lines printed at exit), ``--step-seconds S`` slows steps
down, ``--checkpoint DIR`` saves the step after each one and resumes from it (an elastic restart continues),
``--progress`` reports each step with ``trainjob.update_trainjob_status`` (the operator's trainerStatus).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-once", type=Path, help="fail only if this marker file is missing (then create it)")
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--progress", action="store_true", help="report progress and loss after every step")
    parser.add_argument("--noise-lines", type=int, default=0, help="print this many lines at exit (after a traceback)")
    args = parser.parse_args()
    if args.noise_lines:
        atexit.register(lambda: print("teardown noise\n" * args.noise_lines, file=sys.stderr, flush=True))

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world} node {os.environ.get('GROUP_RANK')} host {socket.gethostname()}", flush=True)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    if args.checkpoint is not None and (args.checkpoint / "step").exists():
        start = int((args.checkpoint / "step").read_text())
        print(f"rank {rank} resumes at step {start}", flush=True)
    loss = torch.tensor(0.0)
    for step in range(start, args.steps):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * world + rank))
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first_time = args.fail_once is None or not args.fail_once.exists()
        if rank == args.fail_rank and step == start and first_time:
            if args.fail_once is not None:
                args.fail_once.touch()
            print(undefined_learning_rate)  # noqa: F821 - the failure the tests look for
        if args.checkpoint is not None and rank == 0:
            args.checkpoint.mkdir(parents=True, exist_ok=True)
            (args.checkpoint / "step").write_text(str(step + 1))
        if args.progress:
            from trainjob import update_trainjob_status

            done = step + 1
            update_trainjob_status(progress_percent=100 * done // args.steps,
                                   estimated_remaining_seconds=int((args.steps - done) * args.step_seconds),
                                   metrics={"loss": round(loss.item(), 4), "step": done})
        time.sleep(args.step_seconds)
    total = torch.tensor([loss.item()])
    dist.all_reduce(total)
    if rank == 0:
        print(f"final loss {total.item() / world:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # DDP's hooks keep the destroyed gloo group alive in reference cycles; freed only in the interpreter's teardown,
    # its worker threads cannot take the GIL and the process aborts (SIGABRT) after a successful run. Free them now.
    del model, optimizer
    gc.collect()


if __name__ == "__main__":
    main()
