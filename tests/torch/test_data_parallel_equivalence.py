"""DDP and FSDP on 2 and 4 real processes train the same weights as one process on the same global batches.

Tolerance: 1e-5 absolute on every parameter after 4 SGD-with-momentum steps in float32 (the runs differ only in
the order gradients are summed; measured differences are ~3e-8). The weights move by more than 1e-2, so a wrong
shard, a missing reduction or a doubled batch shows up far above the tolerance.
"""

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

TOLERANCE = 1e-5
GLOBAL_BATCH = 8


@pytest.fixture(scope="module", params=[2, 4], ids=["2proc", "4proc"])
def results(distributed, request: pytest.FixtureRequest) -> dict[str, Any]:
    ranks = distributed(
        "dist_workers_equivalence:run_all", nproc=request.param, kwargs={"steps": 4, "global_batch": GLOBAL_BATCH}
    )
    return {"nproc": request.param, "rank0": ranks[0], "ranks": ranks}


@pytest.mark.parametrize(
    ("scenario", "samples_per_step"),
    [
        ("ddp/micro1", GLOBAL_BATCH),
        ("ddp/micro2", 2 * GLOBAL_BATCH),  # 2 micro-steps equal one double batch
        ("ddp/clip", GLOBAL_BATCH),
        ("fsdp/micro1", GLOBAL_BATCH),
        ("fsdp/micro2", 2 * GLOBAL_BATCH),
        ("fsdp/clip", GLOBAL_BATCH),
    ],
)
def test_weights_match_one_process_on_the_same_global_batch(results, scenario, samples_per_step):
    got = results["rank0"][scenario]
    assert got["steps"] == 4
    assert got["samples_per_step"] == [samples_per_step]
    assert got["distinct_per_step"], "ranks saw overlapping samples"
    assert got["param_change"] > 1e-2, "training did not move the weights; the comparison would prove nothing"
    assert got["param_diff"] < TOLERANCE


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_clipping_uses_the_global_gradient_norm(results, strategy):
    got = results["rank0"][f"{strategy}/clip"]
    assert len(got["norms"]) == 4
    assert min(got["ref_norms"]) > 0.05, "clipping was not active"
    assert got["norms"] == pytest.approx(got["ref_norms"], rel=1e-5)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_accumulation_does_not_reduce_gradients_before_the_last_micro_step(results, strategy):
    assert results["rank0"][f"{strategy}/micro2"]["unsynced_micro_step"] == [True]


def test_every_epoch_is_split_across_ranks_and_reshuffled_without_set_epoch(results):
    nproc = results["nproc"]
    per_epoch = (20 // nproc // 2) * 2 * nproc  # 20 samples, batches of 2 per rank, incomplete batches dropped
    for rank, got in enumerate(results["ranks"]):
        loader = got["loader"]
        assert loader["sampler"] == "DistributedSampler"
        assert loader["epoch_sizes"] == [per_epoch, per_epoch], f"rank {rank}"
        assert loader["disjoint"]
        if per_epoch == 20:  # nothing dropped: every epoch is the whole dataset
            assert loader["same_samples"]
        assert loader["orders_differ"], "the second epoch repeated the first epoch's order"
        assert loader["epoch_after"] == 2
