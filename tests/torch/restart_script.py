"""A training script that loses a rank at ``--crash-at`` on its first attempt, then is started again.

The attempt number comes from ``TRAINJOB_RESTART_COUNT`` (set by the local backend when it restarts a node group)
or ``TORCHELASTIC_RESTART_COUNT`` (torchrun --max-restarts). Every attempt resumes from the newest checkpoint; the last one then trains the same run again without
checkpoints, in the same processes, and rank 0 saves both final weights to ``--out`` for comparison.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dist_workers_checkpoint import run_training  # noqa: E402

import trainjob.torch as tt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoints", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--crash-at", type=int, default=5)
    args = parser.parse_args()

    attempt = int(os.environ.get("TRAINJOB_RESTART_COUNT") or os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    ctx = tt.init()
    common = {"total_steps": args.steps, "strategy": "ddp", "dropout": 0.25}
    resumed = run_training(
        args.checkpoints,
        save_steps=tuple(range(2, args.steps + 1, 2)),
        crash_at=args.crash_at if attempt == 0 else None,
        report_metrics=True,
        **common,
    )
    uninterrupted = run_training(None, **common)
    if ctx.is_main:
        torch.save(
            {"attempt": attempt, "start": resumed["start"], "resumed": resumed["params"], "uninterrupted": uninterrupted["params"]},
            args.out,
        )
    tt.shutdown()


if __name__ == "__main__":
    main()
