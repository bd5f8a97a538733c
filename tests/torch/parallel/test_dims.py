import pytest

from trainjob.errors import ValidationError
from trainjob.torch.parallel import ParallelDims


def seed_groups(tp: int, pp: int, dp: int) -> dict[str, list[list[int]]]:
    """The groups as the 3-D ParallelConfig of the design notes builds them: ranks laid out [DP, PP, TP]."""

    def rank(d: int, p: int, t: int) -> int:
        return d * pp * tp + p * tp + t

    return {
        "tp": [[rank(d, p, t) for t in range(tp)] for d in range(dp) for p in range(pp)],
        "pp": [[rank(d, p, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
        "dp": [[rank(d, p, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
    }


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"tp": 2, "pp": 2, "world_size": 8}, {"dp_replicate": 1, "dp_shard": 2, "tp": 2, "pp": 2}),
        ({"dp_shard": 2, "tp": -1, "world_size": 8}, {"dp_replicate": 1, "dp_shard": 2, "tp": 4, "pp": 1}),
        (
            {"dp_replicate": 2, "dp_shard": 2, "pp": -1, "world_size": 8},
            {"dp_replicate": 2, "dp_shard": 2, "tp": 1, "pp": 2},
        ),
        ({"dp_shard": 4, "world_size": 4}, {"dp_replicate": 1, "dp_shard": 4, "tp": 1, "pp": 1}),
    ],
)
def test_minus_one_takes_the_rest_of_the_world(kwargs, expected):
    dims = ParallelDims(**kwargs)
    assert {k: getattr(dims, k) for k in expected} == expected
    assert dims.dp == expected["dp_replicate"] * expected["dp_shard"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"dp_shard": 1, "tp": 3, "world_size": 8},
            r"^parallel: dp_replicate=1 \* dp_shard=1 \* tp=3 \* pp=1 = 3 must equal world_size=8",
        ),
        (
            {"dp_shard": 2, "tp": 2, "world_size": 8},
            r"= 4 must equal world_size=8; set dp_shard=4 \(or dp_shard=-1\)",
        ),
        (
            {"tp": 3, "world_size": 8},
            r"^parallel.dp_shard: cannot fill the rest: .*tp=3.* = 3 does not divide world_size=8",
        ),
        (
            {"tp": -1, "pp": -1, "world_size": 8},
            r"^parallel: only one size may be -1 \(the rest\), got -1 for dp_shard, tp and pp; give",
        ),
        ({"tp": 0, "world_size": 8}, r"^parallel.tp: must be >= 1 or -1 \(the rest\), got 0"),
        ({"world_size": 0}, r"^parallel.world_size: must be >= 1, got 0"),
    ],
)
def test_sizes_that_do_not_fit_the_world_say_what_to_set(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        ParallelDims(**kwargs)


def test_world_size_defaults_to_the_launcher_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "6")
    assert ParallelDims(tp=2).dp_shard == 3


def test_a_malformed_launcher_world_size_is_named(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "six")
    with pytest.raises(ValidationError, match=r"^WORLD_SIZE: must be an integer, got 'six'"):
        ParallelDims(tp=2)


@pytest.mark.parametrize(("tp", "pp", "dp"), [(2, 2, 2), (2, 4, 1), (4, 1, 2), (1, 2, 4)])
def test_groups_follow_the_dp_pp_tp_rank_order_of_the_design_notes(tp, pp, dp):
    dims = ParallelDims(dp_shard=dp, tp=tp, pp=pp, world_size=tp * pp * dp)
    expected = seed_groups(tp, pp, dp)
    for dim in ("tp", "pp", "dp"):
        assert sorted(dims.groups(dim)) == sorted(expected[dim])


def test_world_size_8_printout_names_the_groups_of_the_3d_example():
    layout = ParallelDims(tp=2, pp=2, dp_shard=2, world_size=8).layout()
    lines = layout.splitlines()
    # Data-parallel replica 0 runs stage 0 on GPUs 0,1 and stage 1 on GPUs 2,3; replica 1 the same on 4-7.
    assert "TP groups: [0, 1] [2, 3] [4, 5] [6, 7]" in lines
    assert "PP groups: [0, 2] [1, 3] [4, 6] [5, 7]" in lines
    assert "DP groups: [0, 4] [1, 5] [2, 6] [3, 7]" in lines
    table = [line.split() for line in lines[lines.index("rank  dp  pp  tp") + 1 :]]
    assert table == [[str(r), str(r // 4), str(r // 2 % 2), str(r % 2)] for r in range(8)]


def test_replicated_and_sharded_data_parallel_ranks_together_form_the_dp_group():
    dims = ParallelDims(dp_replicate=2, dp_shard=2, tp=2, world_size=8)
    assert dims.groups("dp_shard") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.groups("dp_replicate") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dims.groups("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert dims.coordinates(6) == {"dp_replicate": 1, "dp_shard": 1, "dp": 3, "pp": 0, "tp": 0}


def test_unknown_dimension_and_rank_out_of_range_are_refused():
    dims = ParallelDims(tp=2, world_size=4)
    with pytest.raises(
        ValidationError, match="dim: must be one of dp, dp_replicate, dp_shard, pp, tp, got 'cp'"
    ):
        dims.groups("cp")
    with pytest.raises(ValidationError, match=r"rank: must be in \[0, 4\), got 4"):
        dims.coordinates(4)
