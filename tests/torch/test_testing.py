import sys
from pathlib import Path

import pytest

from trainjob.torch.testing import DistributedRunError

sys.path.insert(0, str(Path(__file__).parent))


def test_results_come_back_in_rank_order_from_a_real_process_group(distributed):
    results = distributed("dist_workers_testing:all_reduce_rank_sum", nproc=3)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert {r["world"] for r in results} == {3}
    assert {r["sum"] for r in results} == {0.0 + 1.0 + 2.0}
    assert [r["env_rank"] for r in results] == ["0", "1", "2"]


def test_a_failing_rank_raises_with_its_traceback(distributed):
    with pytest.raises(DistributedRunError, match=r"rank 1 of 2 failed(.|\n)*rank 1 fails on purpose"):
        distributed("dist_workers_testing:fail_on_rank", nproc=2, kwargs={"rank": 1}, timeout=60)


def test_a_target_that_is_not_module_colon_function_is_refused(distributed):
    with pytest.raises(ValueError, match="package.module:function"):
        distributed("no_colon_here", nproc=2)
