"""Checkpoints across world sizes, crashes and restarts, with real processes.

Resuming at the same world size must give bit-identical weights. Resuming at another world size changes only
the order gradients are summed in, so the weights agree to 1e-5 (measured: ~3e-8).
"""

import json
import sys
from pathlib import Path

import pytest
import torch

from trainjob.torch.checkpoint import Checkpointer
from trainjob.torch.testing import DistributedRunError

sys.path.insert(0, str(Path(__file__).parent))
import dist_workers_checkpoint as workers  # noqa: E402

HERE = Path(__file__).parent
RESHARD_TOLERANCE = 1e-5


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_saved_at_world_size_4_resumed_at_2_ends_like_the_uninterrupted_run(distributed, tmp_path):
    directory = str(tmp_path / "ckpt")
    # Uninterrupted FSDP run at 4 processes, saving in the background at steps 3 and 4 (keep_last=1).
    full = distributed(
        "dist_workers_checkpoint:run_training",
        nproc=4,
        kwargs={"directory": directory, "total_steps": 9, "save_steps": (3, 4), "async_save": True, "keep_last": 1},
    )[0]
    assert full["committed"] == [4]
    # Continue from step 4 (mid-epoch) at 2 processes with the same global batch.
    resumed = distributed(
        "dist_workers_checkpoint:run_training", nproc=2, kwargs={"directory": directory, "total_steps": 9}
    )[0]
    assert resumed["start"] == 4
    assert resumed["last_lr"] == full["last_lr"]  # the LR scheduler came back too
    assert _max_diff(resumed["params"], full["params"]) < RESHARD_TOLERANCE


def test_a_crash_between_shards_and_commit_leaves_the_previous_checkpoint_loadable(distributed, tmp_path, single_process):
    directory = tmp_path / "ckpt"
    kwargs = {"directory": str(directory), "total_steps": 4, "save_steps": (2, 4), "crash_before_commit_at": 4}
    # Rank 0 dies in the commit; rank 1, waiting for it, may notice first.
    with pytest.raises(DistributedRunError, match="rank 0 of 2 exited with code 3|rank 1 of 2 failed"):
        distributed("dist_workers_checkpoint:run_training", nproc=2, kwargs=kwargs, timeout=90)

    partial = directory / ".partial-step-00000004"
    assert (partial / ".metadata").is_file(), "the crash was meant to come after every shard was written"
    assert Checkpointer(directory).steps() == [2]

    # One process (this one), no sharding: loads the step-2 checkpoint written by 2 FSDP ranks and trains on to
    # step 4 ...
    resumed = workers.run_training(str(directory), total_steps=4, strategy="none", save_steps=(3,))
    assert resumed["start"] == 2
    assert resumed["committed"] == [2, 3]
    assert not partial.exists(), "the next save removes what the crash left behind"
    # ... and ends where an uninterrupted run ends.
    fresh = workers.run_training(None, total_steps=4, strategy="none")
    assert _max_diff(resumed["params"], fresh["params"]) < RESHARD_TOLERANCE


def test_a_rank_killed_mid_training_restarts_from_the_last_checkpoint_with_identical_weights(tmp_path, torchrun):
    metrics = tmp_path / "metrics.jsonl"
    out = tmp_path / "weights.pt"
    # Restart from checkpoint the way the local backend restarts a node group: a new launch of the whole group.
    # (torchrun's in-place --max-restarts on CPU/gloo sometimes aborts the restarted workers in gloo set-up.)
    args = ("--checkpoints", str(tmp_path / "ckpt"), "--out", str(out), "--steps", "8", "--crash-at", "5")
    first = torchrun(HERE / "restart_script.py", *args, env={"TRAINJOB_METRICS_FILE": str(metrics)})
    # torchrun names whichever failure it saw first: the lost rank (exit 17) or the survivor its loss broke.
    assert first.returncode != 0 and not out.exists(), "the first attempt was meant to lose a rank"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if not p.name.startswith(".")) == [
        "step-00000002",
        "step-00000004",
    ], "the first attempt was meant to die after its step-4 checkpoint"
    second = torchrun(
        HERE / "restart_script.py", *args, env={"TRAINJOB_METRICS_FILE": str(metrics), "TRAINJOB_RESTART_COUNT": "1"}
    )
    assert second.returncode == 0, second.stderr[-4000:]
    result = torch.load(out)
    assert result["attempt"] == 1
    assert result["start"] == 4  # checkpoints every 2 steps, killed during step 5
    # Dropout is on: equal weights need the restored RNG state as well as the model, optimizer and data position.
    for name, tensor in result["uninterrupted"].items():
        assert torch.equal(result["resumed"][name], tensor), name

    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 9))
    assert {r["total_steps"] for r in records} == {8}
    assert all(set(r["metrics"]) == {"loss", "lr"} and isinstance(r["time"], float) for r in records)
