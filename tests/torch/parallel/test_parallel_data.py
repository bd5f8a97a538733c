"""Data loaders shard by data-parallel rank once a model is parallelized: a real 4-process gloo run.

Tolerance: losses within 1e-5 of one process trained on the same global batches (float32 rounding is ~1e-7).

Under tensor or pipeline parallelism the ranks of one TP/PP group form one model replica and must read the same
batches, while data-parallel replicas read disjoint shares that together cover the dataset once per epoch.
"""

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

DATASET = 32


@pytest.fixture(scope="module")
def results(distributed) -> dict[str, Any]:
    return distributed("dist_workers_data:run_all", nproc=4, timeout=240)[0]


def _check_replicas(epoch: dict[str, Any], replicas: list[list[int]]) -> None:
    ranks = epoch["ranks"]
    for group in replicas:  # the ranks of one model replica read the same batches
        assert all(ranks[r]["indices"] == ranks[group[0]]["indices"] for r in group), group
        assert {ranks[r]["rank"] for r in group} == {replicas.index(group)}
        assert {ranks[r]["world_size"] for r in group} == {len(replicas)}
    shares = [sorted(i for batch in ranks[group[0]]["indices"] for i in batch) for group in replicas]
    everything = sorted(i for share in shares for i in share)
    assert everything == list(range(DATASET)), "replicas must split the dataset without overlap"


def test_without_a_parallel_model_every_rank_is_a_replica(results) -> None:
    _check_replicas(results["before_any_model"], [[0], [1], [2], [3]])
    _check_replicas(results["after_prepare_model_ddp"], [[0], [1], [2], [3]])


@pytest.mark.parametrize(
    ("scenario", "replicas"),
    [
        ("tp2_dp2", [[0, 1], [2, 3]]),  # TP groups [0, 1] [2, 3]
        ("tp2_dp2_loader_built_before_the_model", [[0, 1], [2, 3]]),  # re-sharded on its next epoch
        ("pp2_dp2", [[0, 1], [2, 3]]),  # PP groups [0, 1] [2, 3]: both stages read the replica's batch
    ],
)
def test_parallel_models_shard_data_by_data_parallel_rank(results, scenario: str, replicas: list[list[int]]) -> None:
    _check_replicas(results[scenario], replicas)


@pytest.mark.parametrize("scenario", ["tp2_dp2", "pp2_dp2"])
def test_training_on_the_sharded_data_matches_one_process_on_the_global_batches(results, scenario: str) -> None:
    losses = [rank["losses"] for rank in results[scenario]["ranks"]]
    assert len(losses[0]) == DATASET // (2 * 2)  # 16 samples per replica in batches of 2: 8 steps
    assert all(rank == pytest.approx(losses[0], abs=1e-6) for rank in losses)  # the global mean on every rank
    # The replicas' batches together are the global batch a single process trains on: same losses at every step
    # (float32 reduction order only; a replica fed another replica's rows, or TP peers fed different rows, moves
    # the loss by ~1e-2 after a few SGD steps).
    assert losses[0] == pytest.approx(results[scenario]["reference_losses"], abs=1e-5)


def test_an_explicit_rank_overrides_the_layout(results) -> None:
    ranks = results["explicit_rank_wins"]["ranks"]
    assert all(r["indices"] == ranks[0]["indices"] and (r["rank"], r["world_size"]) == (0, 1) for r in ranks)
