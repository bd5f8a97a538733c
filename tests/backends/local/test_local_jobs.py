"""End-to-end behaviour of local jobs with real supervisor, torchrun and worker processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import psutil
import pytest
from jobtest.local import processes_under, trainjob_resource, wait_until

from trainjob.backends.local import processes
from trainjob.errors import JobFailedError, NotFoundError

SLEEPER = """
    import os, sys, time
    with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], f"pid-{os.environ.get('RANK', 'node')}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
"""


def test_two_jobs_run_at_once_and_every_rank_knows_its_place(backend, probe):
    env = [{"name": "GREETING", "value": "hello $HOME"}]
    backend.apply(trainjob_resource("big", ["torchrun", probe], num_nodes=2, num_proc_per_node=2, env=env,
                                    resources_per_node={"requests": {"cpu": "1"}}))
    backend.apply(trainjob_resource("small", ["torchrun", probe], num_nodes=2, num_proc_per_node=1))

    rank0_lines = [line.text for line in backend.logs("big", rank=0, follow=True)]

    for name in ("big", "small"):
        assert backend.wait_for_job_status(name, timeout=120).status == "Complete"
    big_dir, small_dir = backend.store.job_dir("big"), backend.store.job_dir("small")
    seen = [json.loads((big_dir / f"rank-{rank}.json").read_text()) for rank in range(4)]
    assert sorted(int(s["RANK"]) for s in seen) == [0, 1, 2, 3]
    for rank, s in enumerate(seen):
        node = rank // 2
        assert s["WORLD_SIZE"] == "4"
        assert (s["GROUP_RANK"], s["PET_NODE_RANK"], s["PET_NNODES"]) == (str(node), str(node), "2")
        assert s["MASTER_ADDR"] == s["PET_MASTER_ADDR"] == "127.0.0.1"
        assert s["GREETING"] == "hello $HOME"  # the pod's env as written, no shell in between
        assert s["TRAINJOB_JOB_NAME"] == "big" and s["TRAINJOB_JOB_DIR"] == str(big_dir)
        assert len(s["cpus"]) == 1 and s["OMP_NUM_THREADS"] == "1"  # one CPU requested, two processes
        assert s["CUDA_VISIBLE_DEVICES"] is None
    if len(os.sched_getaffinity(0)) >= 2:
        assert seen[0]["cpus"] != seen[2]["cpus"], "nodes are pinned to disjoint cores"
    small = json.loads((small_dir / "rank-0.json").read_text())
    assert small["cpus"] == sorted(os.sched_getaffinity(0)), "without a CPU request nodes are not pinned"
    assert small["OMP_NUM_THREADS"] == str(max(1, len(small["cpus"]) // 2))
    assert seen[0]["MASTER_PORT"] != small["MASTER_PORT"]

    assert rank0_lines == [f"line {i}" for i in range(40)]
    job = backend.get_job("big")
    assert (job.progress.step, job.progress.total_steps, job.progress.metrics) == (20, 40, {"loss": 0.05})
    assert [s.status for s in job.steps] == ["Succeeded", "Succeeded"]
    assert [e.reason for e in backend.get_job_events("big")].count("ImageNotUsed") == 1


def test_failed_rank_is_named_and_waiting_stops_at_once(backend, script, trainjob_home):
    failing = script("fail.py", """
        import os, time
        if os.environ["RANK"] == "3":
            raise ValueError("boom on rank 3")
        time.sleep(600)
    """)
    started = time.monotonic()
    backend.apply(trainjob_resource("fails", ["torchrun", failing], num_nodes=2, num_proc_per_node=2))

    with pytest.raises(JobFailedError, match=r"NodeFailed: node-1 rank 3: ValueError: boom on rank 3$"):
        backend.wait_for_job_status("fails", timeout=600)

    # Far below the other ranks' sleep, far above the start of 4 ranks on a busy machine (74 s seen beside the
    # cluster tier): the failure ended the job, the sleepers did not.
    assert time.monotonic() - started < 300, "the other ranks sleep 600 s; the failure must end the job first"
    job = backend.get_job("fails")
    assert (job.status, job.reason) == ("Failed", "NodeFailed")
    assert [s.status for s in job.steps] == ["Stopped", "Failed"]
    wait_until(lambda: processes_under(trainjob_home) == [], timeout=15)


# Every rank joins a gloo all-reduce loop after writing its pid, until one of them is killed.
ALL_REDUCE_FOREVER = """
    import os, time
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], f"pid-{dist.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))
    t = torch.ones(1)
    while True:
        dist.all_reduce(t)
        time.sleep(0.01)
"""


@pytest.mark.parametrize("victim", [1, 2])
def test_the_killed_rank_is_named_not_the_ranks_that_died_after_it(backend, script, victim):
    looping = script("loop.py", ALL_REDUCE_FOREVER)
    backend.apply(trainjob_resource("oom", ["torchrun", looping], num_nodes=2, num_proc_per_node=2))
    job_dir = backend.store.job_dir("oom")
    wait_until(lambda: all((job_dir / f"pid-{rank}").exists() for rank in range(4)), timeout=120)
    time.sleep(0.5)  # the all-reduce loop is running on every rank

    os.kill(int((job_dir / f"pid-{victim}").read_text()), signal.SIGKILL)

    with pytest.raises(JobFailedError) as failed:
        backend.wait_for_job_status("oom", timeout=120)
    expected = f"node-{victim // 2} rank {victim} (local rank {victim % 2}) was killed by SIGKILL"
    assert str(failed.value).endswith(f"NodeFailed: {expected}")


def test_delete_stops_every_process_of_a_running_job(backend, script, trainjob_home):
    sleeper = script("sleeper.py", SLEEPER)
    backend.apply(trainjob_resource("doomed", ["torchrun", sleeper], num_nodes=1, num_proc_per_node=2))
    job_dir = backend.store.job_dir("doomed")
    wait_until(lambda: (job_dir / "pid-0").exists() and (job_dir / "pid-1").exists(), timeout=60)
    row = backend.store.get_job("doomed")
    pids = [row["supervisor_pid"], backend.store.nodes("doomed")[0]["pid"]]
    pids += [int((job_dir / f"pid-{rank}").read_text()) for rank in (0, 1)]
    started = {pid: psutil.Process(pid).create_time() for pid in pids}

    backend.delete_job("doomed")

    assert [pid for pid in pids if processes.is_alive(pid, started[pid])] == []
    assert processes_under(trainjob_home) == []
    assert not job_dir.exists()
    with pytest.raises(NotFoundError):
        backend.get_job("doomed")


CHECKPOINTING = """
    import os, time
    ckpt = os.path.join(os.environ["TRAINJOB_JOB_DIR"], "ckpt")
    start = int(open(ckpt).read() or 0) if os.path.exists(ckpt) else 0
    if os.environ["RANK"] == "0":
        print("resumes at step", start, flush=True)
        with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], "resumes"), "a") as f:
            f.write(f"{start}\\n")
    for step in range(start, 100000):
        time.sleep(0.05)
        if os.environ["RANK"] == "0":
            with open(ckpt + ".tmp", "w") as f:
                f.write(str(step + 1))
            os.replace(ckpt + ".tmp", ckpt)
"""


def test_suspend_and_resume_of_torchrun_rounds_stop_every_process_and_go_on_from_the_checkpoint(
        backend, script, trainjob_home):
    """torchrun on 2 nodes, suspended and resumed 3 times: Suspended each time with no process left, never Failed
    (torchrun exits 1 on the SIGTERM the nodes get), and each resume goes on from the step the last one reached."""
    worker = script("checkpointing.py", CHECKPOINTING)
    backend.apply(trainjob_resource("pausable", ["torchrun", worker], num_nodes=2))
    job_dir = backend.store.job_dir("pausable")

    def step() -> int:
        path = job_dir / "ckpt"
        return int(path.read_text() or 0) if path.exists() else 0

    before: list[int] = []
    for _ in range(3):
        reached = before[-1] if before else 0
        wait_until(lambda since=reached: step() >= since + 5, timeout=60)
        backend.suspend_job("pausable")
        assert backend.get_job("pausable").status == "Suspended"
        assert processes_under(trainjob_home) == []
        before.append(step())
        backend.resume_job("pausable")
    wait_until(lambda: step() >= before[-1] + 5, timeout=60)
    resumes = [int(line) for line in (job_dir / "resumes").read_text().split()]
    assert resumes[0] == 0 and resumes[1:] == before, (resumes, before)
    reasons = [e.reason for e in backend.get_job_events("pausable")]
    assert reasons.count("Suspended") == 3 and reasons.count("Resumed") == 3
    assert "Failed" not in reasons and backend.get_job("pausable").status == "Running"
    backend.delete_job("pausable")


def test_active_deadline_fails_a_job_that_runs_too_long(backend, script):
    sleeper = script("sleeper.py", SLEEPER)
    backend.apply(trainjob_resource("slow", ["python", sleeper], spec={"activeDeadlineSeconds": 1}))

    with pytest.raises(JobFailedError, match="DeadlineExceeded"):
        backend.wait_for_job_status("slow", timeout=30)


def test_elastic_job_restarts_its_node_group_up_to_max_restarts(backend, script, elastic_runtimes):
    flaky = script("flaky.py", """
        import os, sys
        print("restart", os.environ["TRAINJOB_RESTART_COUNT"], flush=True)
        if os.environ["TRAINJOB_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
            sys.exit(3)
    """)
    backend.apply(trainjob_resource("elastic", ["torchrun", flaky], runtime="torch-elastic"), elastic_runtimes)
    # node-1 starts 3 s late, as on a machine busier than its cores: the first round waits for it rather than
    # starting node-0 alone (whose rank would finish and close the rendezvous that node-1 then fails to join)
    _pause_node(backend, "elastic", 1, seconds=3.0)

    job = backend.wait_for_job_status("elastic", timeout=120)

    assert (job.status, job.restarts, job.num_nodes) == ("Complete", 1, 2)
    restarting = [e for e in backend.get_job_events("elastic") if e.reason == "Restarting"]
    assert len(restarting) == 1 and "node-1 rank 1" in restarting[0].message
    # each attempt starts a fresh log; the one before the restart is kept for --previous (kubectl's semantics)
    assert [line.text for line in backend.logs("elastic", rank=1)] == ["restart 1"]
    assert [line.text for line in backend.logs("elastic", rank=1, previous=True)] == ["restart 0"]


def _pause_node(backend, name: str, index: int, seconds: float) -> None:
    """Stop node ``index``'s process tree (SIGSTOP) as soon as it runs, and let it go on ``seconds`` later."""
    def running_pid():
        rows = backend.store.nodes(name)
        return len(rows) > index and rows[index]["status"] == "Running" and rows[index]["pid"]

    paused = processes.tree_pids([int(wait_until(running_pid, timeout=30))])
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(seconds)
    for pid in paused:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
