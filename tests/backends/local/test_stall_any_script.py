"""The stall watch on scripts that never report progress: plain torchrun scripts (gloo, no ``trainjob.torch``)
and a DDP script with no explicit collective. Their collectives are the signal: each rank's ``sitecustomize`` reads
torch's flight recorder, and the supervisor finds a rank waiting in a collective while none completes.

Limits are a few seconds here (``trainjob/stall-timeout``); the default for such scripts is tabled in
``trainjob.backends.stall``.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
from jobtest.local import trainjob_resource, wait_until

from trainjob.backends.local.client.backend import LocalBackend
from trainjob.backends.local.supervisor.stall_watch import StallWatch, rank_collectives
from trainjob.backends.stall import StallPolicy
from trainjob.errors import JobFailedError
from trainjob.runnable import RunnableTimeline

#: A plain torchrun script: an all_reduce every 0.1 s, rank 0 printing every fifth step. At step 20 rank 1 either
#: blocks in ``load_batch`` for ``argv[2]`` seconds (``sleep``) or skips the all_reduce (``skip``) and, at the end,
#: waits in the closing barrier while rank 0 waits in its last all_reduce.
PLAIN = """
    import os, sys, time
    import torch, torch.distributed as dist

    KIND, STALL_STEP = sys.argv[1], 20
    SLEEP = float(sys.argv[2]) if len(sys.argv) > 2 else 600.0

    def load_batch(step):
        if KIND == "sleep" and step == STALL_STEP and dist.get_rank() == 1:
            with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], "stalled-at"), "w") as f:
                f.write(repr(time.time()))
            time.sleep(SLEEP)  # blocked, as a data loader reading from a stuck mount would be
        return torch.ones(4)

    dist.init_process_group("gloo")
    for step in range(1, 41):
        batch = load_batch(step)
        if KIND == "skip" and step == STALL_STEP and dist.get_rank() == 1:
            continue  # a rank-dependent branch around a collective
        dist.all_reduce(batch)
        if dist.get_rank() == 0 and step % 5 == 0:
            print(f"step {step}", flush=True)
        time.sleep(0.1)
    dist.barrier()
    dist.destroy_process_group()
"""

#: DDP with no explicit collective: its bucketed gradient all-reduces are issued from C++.
DDP = """
    import os, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    def next_batch(step):
        if step == 20 and dist.get_rank() == 1:
            with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], "stalled-at"), "w") as f:
                f.write(repr(time.time()))
            time.sleep(600)
        return torch.randn(4, 8)

    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 41):
        loss = model(next_batch(step)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.05)
    del model
    dist.destroy_process_group()
"""

#: Slow by design, each phase past or near the limit LIMIT, then a real stall: loading data before any
#: collective (not watched yet), every rank computing (nobody waits), rank 0 evaluating while rank 1 waits at a
#: barrier (within the limit). Then rank 1 blocks for good: the stall watch was armed all along.
SLOW = """
    import os, sys, time
    import torch, torch.distributed as dist

    LIMIT = float(sys.argv[1])
    time.sleep(1.5 * LIMIT)  # loading data: no collective yet
    dist.init_process_group("gloo")
    rank, t = int(os.environ["RANK"]), torch.ones(1)
    for _ in range(5):
        dist.all_reduce(t)
    time.sleep(1.5 * LIMIT)  # every rank computing
    dist.all_reduce(t)
    if rank == 0:
        time.sleep(0.5 * LIMIT)  # evaluating, while rank 1 waits at the barrier
    dist.barrier()
    with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], f"slow-phases-done-{rank}"), "w") as f:
        f.write(repr(time.time()))

    def stuck_for_good():
        time.sleep(600)

    if rank == 1:
        stuck_for_good()
    dist.all_reduce(t)
"""


def _job(name: str, argv: list[str], annotations: dict[str, str]) -> object:
    job = trainjob_resource(name, ["torchrun", *argv], num_nodes=2, num_proc_per_node=1)
    job.metadata.annotations = annotations
    return job


def _stalled(backend: LocalBackend, name: str) -> list:
    return [e for e in backend.get_job_events(name) if e.reason == "Stalled"]


def _silent(message: str) -> float:
    return float(re.match(r"no collective completed for ([0-9.]+) s ", message)[1])


def _stalled_at(backend: LocalBackend, name: str) -> float:
    return float((backend.store.job_dir(name) / "stalled-at").read_text())


def test_a_plain_script_whose_rank_sleeps_is_announced_naming_the_rank_and_its_frame_while_it_lasts(
        backend, script):
    hang = script("hang.py", PLAIN)
    backend.apply(_job("sleeps", [hang, "sleep", "14"], {"trainjob/stall-timeout": "4s"}))

    first = wait_until(lambda: _stalled(backend, "sleeps"), timeout=120, what="a Stalled event")[0]
    assert first.type == "Warning", first
    assert re.fullmatch(
        r"no collective completed for [0-9.]+ s while rank 0 waits in one \(limit 4\.0 s: trainjob/stall-timeout\): "
        r"rank 1 is not in the all_reduce that rank 0 waits in: rank 1 is in load_batch \(hang\.py:12\); every "
        r"rank's stacks: .*stall-stacks\.txt; the job runs on "
        r"\(trainjob/stall-action: fail or restart acts on a stall\)", first.message), first.message
    announced_after = first.event_time.timestamp() - _stalled_at(backend, "sleeps")
    assert 4.0 < announced_after < 4.0 + 10.0, announced_after
    job = backend.store.get_job("sleeps")
    assert job["status"] == "Running" and job["message"] == f"stalled: {first.message}"

    # repeated every limit while it lasts; the job runs on, and completes once rank 1 does
    backend.wait_for_job_status("sleeps", {"Complete"}, timeout=120, polling_interval=0.2)
    events = [(e.reason, e.message) for e in backend.get_job_events("sleeps")]
    reasons = [reason for reason, _ in events]
    second = _stalled(backend, "sleeps")[1]
    assert _silent(second.message) >= 8.0 and "rank 1 is in load_batch (hang.py:12)" in second.message, second.message
    assert reasons.index("StallEnded") > reasons.index("Stalled") + 1 and reasons[-1] == "Completed", reasons
    [ended] = [message for reason, message in events if reason == "StallEnded"]
    assert re.fullmatch(r"collectives complete again, after a stall of 1[0-9]\.[0-9] s", ended), ended
    print(f"plain script, rank 1 asleep: announced {announced_after:.1f} s after it stopped (limit 4 s)",
          file=sys.stderr)


def test_a_plain_script_whose_rank_skips_a_collective_is_announced_naming_the_rank_and_its_frame(backend, script):
    hang = script("hang.py", PLAIN)
    backend.apply(_job("skips", [hang, "skip"], {"trainjob/stall-timeout": "4s"}))

    [first, *_] = wait_until(lambda: _stalled(backend, "skips"), timeout=120, what="a Stalled event")
    assert ("rank 1 is in another collective than the all_reduce that rank 0 waits in: rank 1 is in barrier: "
            "barrier (torch/distributed/distributed_c10d.py:") in first.message, first.message
    assert "called from <module> (hang.py:24)" in first.message, first.message
    # past the 4 s limit when announced; the message rounds to 0.1 s, so 4.04 s reads "4.0 s"
    assert 4.0 <= _silent(first.message) < 4.0 + 5.0, first.message


def test_a_ddp_script_whose_rank_stops_is_caught_and_fails_when_the_action_says_so(backend, script):
    ddp = script("ddp.py", DDP)
    backend.apply(_job("ddp", [ddp], {"trainjob/stall-timeout": "4s", "trainjob/stall-action": "fail"}))

    with pytest.raises(JobFailedError):
        backend.wait_for_job_status("ddp", {"Complete"}, timeout=120, polling_interval=0.2)
    job = backend.store.get_job("ddp")
    assert job["reason"] == "Stalled", job["message"]
    assert "rank 1 is not in the backward that rank 0 waits in: rank 1 is in next_batch (ddp.py:10)" in \
           job["message"], job["message"]
    [stalled] = _stalled(backend, "ddp")
    assert stalled.message == job["message"]
    announced_after = stalled.event_time.timestamp() - _stalled_at(backend, "ddp")
    assert 4.0 < announced_after < 4.0 + 15.0, announced_after  # the nodes were stopped before the job failed


def test_slow_by_design_phases_are_not_stalls_and_the_stall_watch_was_armed_all_along(backend, script):
    slow = script("slow.py", SLOW)
    backend.apply(_job("slow", [slow, "5"], {"trainjob/stall-timeout": "5s", "trainjob/stall-action": "fail"}))

    with pytest.raises(JobFailedError):
        backend.wait_for_job_status("slow", {"Complete"}, timeout=150, polling_interval=0.2)
    job_dir = backend.store.job_dir("slow")
    events = [f"{e.reason}: {e.message}" for e in backend.get_job_events("slow")]
    assert all((job_dir / f"slow-phases-done-{rank}").exists() for rank in (0, 1)), events
    done = max(float((job_dir / f"slow-phases-done-{rank}").read_text()) for rank in (0, 1))
    [stalled] = _stalled(backend, "slow")
    assert stalled.event_time.timestamp() > done + 5.0, "a slow-by-design phase was taken for a stall"
    assert "rank 1 is in stuck_for_good (slow.py:20)" in stalled.message, stalled.message


def test_ranks_of_an_earlier_run_are_left_out_and_their_files_removed(tmp_path):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    live = {"rank": 0, "pid": 1, "completed_at": 10.0, "waiting_since": 11.0}  # pid 1 always runs
    gone = {"rank": 1, "pid": 999_999_999, "completed_at": 10.0, "waiting_since": None}
    (stacks / "collectives-rank-0-1.json").write_text(json.dumps(live))
    (stacks / "collectives-rank-1-999999999.json").write_text(json.dumps(gone))
    (stacks / "collectives-rank-2-7.json.tmp").write_text("{")  # a rank's write under way
    assert [(r.rank, r.completed_at, r.waiting_since) for r in rank_collectives(tmp_path)] == [(0, 10.0, 11.0)]
    assert sorted(path.name for path in stacks.iterdir()) == ["collectives-rank-0-1.json",
                                                              "collectives-rank-2-7.json.tmp"]


def test_the_timeline_is_the_wall_clock_outside_its_readings_and_interpolates_between_them():
    assert RunnableTimeline().elapsed(100.0, 130.0) == 30.0  # nothing to watch: the wall clock
    timeline = RunnableTimeline(lambda: [])
    timeline.times, timeline.runnable = [100.0, 110.0, 120.0], [0.0, 2.0, 12.0]  # 8 s of the first 10 spent queued
    assert timeline.at(105.0) == 1.0 and timeline.at(90.0) == -10.0 and timeline.at(125.0) == 17.0
    assert timeline.elapsed(100.0, 120.0) == 12.0


def _watch_with_a_waiting_rank(tmp_path, queued: float) -> tuple[StallWatch, float]:
    """A stall watch over one live rank (this process) that has waited in a collective for 10 s, of which the
    ranks spent ``queued`` seconds waiting for a CPU; limit 5 s."""
    now = 1_000.0
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    record = {"rank": 0, "pid": os.getpid(), "completed_at": now - 20.0, "waiting_since": now - 10.0}
    (stacks / f"collectives-rank-0-{os.getpid()}.json").write_text(json.dumps(record))
    watch = StallWatch(tmp_path, StallPolicy(timeout=5.0, action="fail"), pids=lambda: [])
    watch.timeline.times, watch.timeline.runnable = [now - 20.0, now - 10.0, now], [0.0, 10.0, 20.0 - queued]
    return watch, now


def test_a_silence_the_ranks_spent_waiting_for_a_cpu_is_not_a_stall(tmp_path):
    watch, now = _watch_with_a_waiting_rank(tmp_path, queued=6.0)  # 4 s of the 10 could run
    assert watch.check(now) is None


def test_a_silence_the_ranks_could_run_in_is_a_stall_and_its_message_gives_both_clocks(tmp_path):
    (tmp_path / "a").mkdir()
    watch, now = _watch_with_a_waiting_rank(tmp_path / "a", queued=0.0)
    stall = watch.check(now)
    assert stall is not None and stall.message.startswith("no collective completed for 10.0 s while rank 0"), stall
    (tmp_path / "b").mkdir()
    watch, now = _watch_with_a_waiting_rank(tmp_path / "b", queued=3.0)
    stall = watch.check(now)
    assert stall is not None and _silent(stall.message) == 7.0, stall
    assert "(10.0 s of wall-clock time, the ranks waiting for a CPU)" in stall.message, stall.message
