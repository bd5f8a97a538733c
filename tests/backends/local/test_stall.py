"""The stall watch and ``trainjob stacks`` on the local backend: real ranks, one of them stuck.

A rank blocked in its data loader leaves its peer waiting in ``all_reduce``; the job is caught within its stall
limit (a few seconds here, through ``trainjob/stall-timeout``) instead of gloo's 30 minutes, and the stuck rank is
named with its frame.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
from jobtest.local import elastic_runtime, trainjob_resource, wait_until

from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.backends.local.stacks import dump_stacks
from trainjob.backends.local.worker_site import SITE_DIR, STACKS_DIR_ENV, STACKS_SIGNAL, STACKS_SIGNAL_ENV
from trainjob.cli.main import main
from trainjob.errors import JobFailedError, ValidationError

#: Rank 1's data loader blocks at STALL_STEP (on the first run of the node group only, with RESTART_ONLY_ONCE);
#: rank 0 reports every step and checkpoints every 5.
TRAIN = """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    import trainjob.torch as tt

    STALL_STEP, TOTAL = 12, 16
    first_run = os.environ.get("TRAINJOB_RESTART_COUNT", "0") == "0"

    class Batches(Dataset):
        def __len__(self):
            return TOTAL
        def __getitem__(self, index):
            if index + 1 == STALL_STEP and dist.get_rank() == 1 and first_run:
                time.sleep(600)  # blocked, as a data loader reading from a stuck mount would be
            return torch.ones(4)

    ctx = tt.init()
    model = torch.nn.Linear(4, 1)
    ckpt = tt.Checkpointer(os.path.join(os.environ["TRAINJOB_JOB_DIR"], "ckpt"))
    start = ckpt.resume(model)
    if ctx.is_main:
        with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], "starts.jsonl"), "a") as f:
            f.write(json.dumps(start) + "\\n")
    loader = DataLoader(Batches(), batch_size=1)
    for step, batch in enumerate(loader, start=1):
        if step <= start:
            continue
        dist.all_reduce(batch)
        tt.report({"loss": 1.0 / step}, step=step, total_steps=TOTAL)
        if step % 5 == 0:
            ckpt.save(step, model)
        time.sleep(0.1)
    tt.shutdown()
"""


def _stall_job(name: str, script: str, timeout: str, runtime: str | None = None) -> object:
    if runtime is None:
        job = trainjob_resource(name, ["torchrun", script], num_nodes=2, num_proc_per_node=1)
    else:  # an elastic runtime decides the node count
        job = trainjob_resource(name, ["torchrun", script], runtime=runtime)
    job.metadata.annotations = {"trainjob/stall-timeout": timeout}
    return job


def _last_report(backend: LocalBackend, name: str) -> dict:
    path = backend.store.job_dir(name) / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1]) if lines else {}


def test_a_stalled_job_fails_naming_the_stuck_rank_and_its_frame(backend, script, capsys):
    train = script("train.py", TRAIN)
    backend.apply(_stall_job("stuck", train, "6s"))
    wait_until(lambda: _last_report(backend, "stuck").get("step") == 11, timeout=90, what="step 11")

    # trainjob stacks, while rank 1 is stuck and rank 0 waits for it
    time.sleep(0.5)
    assert main(["stacks", "stuck"]) == 0
    printed = capsys.readouterr().out
    assert "--- rank 0 (node-0, pid " in printed and "--- rank 1 (node-1, pid " in printed
    assert f'File "{train}", line 15 in __getitem__' in printed
    assert printed.rstrip().splitlines()[-1] == (
        "rank 1 is not in the all_reduce that rank 0 waits in: rank 1 is in __getitem__ (train.py:15)")

    with pytest.raises(JobFailedError):
        backend.wait_for_job_status("stuck", {"Complete"}, timeout=60, polling_interval=0.2)
    job = backend.store.get_job("stuck")
    assert job["reason"] == "Stalled"
    assert job["message"].startswith("no progress for ")
    assert "(limit 6.0 s: trainjob/stall-timeout): rank 1 is not in the all_reduce that rank 0 waits in: rank 1 is " \
           "in __getitem__ (train.py:15); every rank's stacks: " in job["message"]
    [stalled] = [e for e in backend.get_job_events("stuck") if e.reason == "Stalled"]
    assert stalled.message == job["message"]
    silent = float(re.match(r"no progress for ([0-9.]+) s ", job["message"])[1])
    assert 6.0 <= silent < 6.0 + 1.5, silent  # caught on time, with the stacks, ...
    fired_after = stalled.event_time.timestamp() - _last_report(backend, "stuck")["time"]
    assert fired_after < 6.0 + 10.0, fired_after  # ... and the job failed once its nodes were stopped
    saved = Path(job["message"].rsplit("every rank's stacks: ", 1)[1]).read_text()
    assert "--- rank 1 (node-1, pid " in saved and "in __getitem__" in saved
    print(f"stalled job: caught {silent} s after the last report, failed {fired_after:.1f} s after it: "
          f"{job['message']}", file=sys.stderr)


def test_a_stalled_elastic_job_restarts_from_its_checkpoint(backend, script):
    train = script("train.py", TRAIN)
    runtime = elastic_runtime("torch-elastic-2", min_nodes=2, max_nodes=2, max_restarts=1)
    # Well above a step on a loaded 2-core machine (a checkpoint save included), so only the planted stall counts.
    job = _stall_job("restarted", train, "12s", runtime="torch-elastic-2")
    backend.apply(job, [runtime])
    backend.wait_for_job_status("restarted", {"Complete"}, timeout=150, polling_interval=0.2)
    reasons = [e.reason for e in backend.get_job_events("restarted")]
    assert reasons.index("Stalled") < reasons.index("Restarting") < reasons.index("Completed")
    [stalled] = [e for e in backend.get_job_events("restarted") if e.reason == "Stalled"]
    assert "rank 1 is not in the all_reduce that rank 0 waits in: rank 1 is in __getitem__ (train.py:15)" in \
           stalled.message
    starts = (backend.store.job_dir("restarted") / "starts.jsonl").read_text().split()
    assert starts == ["0", "10"]  # the second run resumed from the step-10 checkpoint


def test_a_bad_stall_annotation_is_refused_when_the_job_is_checked(trainjob_home, tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))
    job = _stall_job("bad", str(tmp_path / "train.py"), "soon")
    with pytest.raises(ValidationError, match=r"^metadata\.annotations\[trainjob/stall-timeout\]: must be a "
                                              r"duration .* got 'soon'$"):
        backend.check(job)
    job.metadata.annotations = {"trainjob/stall-action": "restart"}
    with pytest.raises(ValidationError, match=r"restart needs restarts to spend"):
        backend.check(job)
    assert backend.list_jobs() == []


#: A stand-in training process: blocks in ``wait_for_batch`` until killed.
BLOCKED = """
    import time
    def wait_for_batch():
        time.sleep(120)
    wait_for_batch()
"""


def test_dump_stacks_reads_live_ranks_and_never_signals_a_process_without_the_handler(script, subprocesses, tmp_path):
    job_dir = tmp_path / "job"
    stacks_dir = job_dir / "stacks"
    blocked = script("blocked.py", BLOCKED)
    rank_env = {
        "PATH": os.environ["PATH"], "PYTHONPATH": SITE_DIR, "TRAINJOB_JOB_DIR": str(job_dir), "LOCAL_RANK": "0",
        "RANK": "3", "GROUP_RANK": "1", "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json"),
        STACKS_DIR_ENV: str(stacks_dir), STACKS_SIGNAL_ENV: str(int(STACKS_SIGNAL)),
    }
    rank = subprocesses.popen([sys.executable, blocked], env=rank_env)
    # Same job and rank, but started without the worker site: it has no handler, and the signal would kill it.
    bare = subprocesses.popen([sys.executable, blocked], env={**rank_env, "PYTHONPATH": "", "RANK": "4"})
    wait_until(lambda: (stacks_dir / f"rank-3-{rank.pid}.txt").exists(), timeout=20, what="rank 3's dump file")
    (stacks_dir / f"rank-4-{bare.pid}.txt").touch()
    (stacks_dir / "rank-5-999999999.txt").touch()  # an earlier run's rank, long gone
    time.sleep(0.3)  # both are in wait_for_batch by now

    found = dump_stacks(job_dir)

    assert [(s.rank, s.node) for s in found] == [(3, 1), (4, None)]
    assert found[0].pid == rank.pid and 'line 4 in wait_for_batch' in (found[0].text or "")
    assert found[0].main_thread()[0].function == "wait_for_batch"
    assert found[1].text is None and found[1].problem == f"rank 4 (pid {bare.pid}) has no handler for the stack signal"
    assert rank.poll() is None and bare.poll() is None
    assert not (stacks_dir / "rank-5-999999999.txt").exists()
