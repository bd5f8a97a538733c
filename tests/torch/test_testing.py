import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainjob.torch.testing import MAX_STRETCH, DistributedRunError, RunnableClock

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


def test_a_hung_rank_times_out_and_names_the_ranks_without_a_result(distributed):
    # The ranks are blocked, not queued for a CPU: the limit runs at wall-clock speed.
    with pytest.raises(DistributedRunError, match=r"timed out after 20s waiting for ranks \[0, 1\]"):
        distributed("dist_workers_testing:hang_on_rank", nproc=2, kwargs={"rank": 1}, timeout=20)


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.procs
def test_the_runnable_clock_runs_at_wall_speed_for_sleepers_and_slower_for_processes_queued_for_a_cpu():
    cores = len(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")
    sleeper = ctx.Process(target=time.sleep, args=(3,))
    sleeper.start()
    clock = RunnableClock(lambda: [sleeper.pid])
    time.sleep(2)
    assert clock.read() == pytest.approx(2, abs=0.3)
    sleeper.kill()
    sleeper.join()

    # Three spinning processes per core: each waits for a CPU about two thirds of the time.
    spinners = [ctx.Process(target=_spin, args=(4,)) for _ in range(3 * cores)]
    for spinner in spinners:
        spinner.start()
    try:
        clock = RunnableClock(lambda: [s.pid for s in spinners])
        start = time.monotonic()
        time.sleep(2)
        counted, wall = clock.read(), time.monotonic() - start
        assert wall / MAX_STRETCH <= counted < 0.8 * wall, (counted, wall)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()


@pytest.mark.procs
def test_a_hung_launch_is_stopped_at_its_limit_with_its_children(tmp_path: Path):
    from jobtest.waiting import run_held_to_runnable_time

    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        run_held_to_runnable_time([sys.executable, "-c", script], timeout=3)
    assert time.monotonic() - start < 30
    assert "started" in raised.value.output
    child = int(pid_file.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
