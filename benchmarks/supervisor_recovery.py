"""What a killed supervisor costs a running job: seconds until it is supervised again and metrics flow again.

A 2 nodes x 1 process DDP job (gloo, a small MLP, one metrics record per step) runs on the local backend; its
supervisor is killed with SIGKILL ``--kills`` times, ``--interval`` seconds apart. For each kill it measures

- **replaced**: kill -> a replacement supervisor holds the job (the ``SupervisorReplaced`` event),
- **metrics resumed**: kill -> the first metrics record the training wrote after the kill is in the store,
- **training stalled**: the longest gap between consecutive steps around the kill, against the median step time
  (the nodes are adopted, not restarted, so training itself should not notice),

then lets the job finish and checks it is ``Complete`` with every step's metrics stored exactly once.

    python benchmarks/supervisor_recovery.py --kills 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

# Test helpers (job resources, process checks) live with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))

TRAIN = textwrap.dedent("""
    import os, sys, time
    import torch
    import trainjob.torch as tt

    ctx = tt.init()
    torch.manual_seed(0)
    model = tt.prepare_model(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    done = os.path.join(os.environ["TRAINJOB_JOB_DIR"], "finish")
    step = 0
    while True:
        x = torch.randn(32, 64)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        tt.report({"loss": loss}, step=step)
        stop = torch.tensor([float(os.path.exists(done))])
        torch.distributed.all_reduce(stop)
        if stop.item() > 0:
            break
        time.sleep(0.02)
    tt.shutdown()
""")


def wait_for(predicate, timeout: float, interval: float = 0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met")


def kill_and_time_recovery(store, name: str) -> dict[str, float]:
    """SIGKILL the job's supervisor; seconds until it is replaced and until new metrics reach the store."""
    lost = store.get_job(name)["supervisor_pid"]
    replaced_before = sum(e["reason"] == "SupervisorReplaced" for e in store.events(name))
    os.kill(lost, signal.SIGKILL)
    killed = time.time()
    # Nothing reads the job meanwhile: the node keepers alone must bring supervision back.
    replaced = wait_for(lambda: [e for e in store.events(name) if e["reason"] == "SupervisorReplaced"][replaced_before:],
                        timeout=60)[0]
    resumed = wait_for(lambda: (store.get_job(name)["metrics_time"] or 0) > killed and time.time(), timeout=60)
    return {"killed": killed, "replaced_s": replaced["time"] - killed, "metrics_resumed_s": resumed - killed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--interval", type=float, default=4.0, help="seconds between kills")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="supervisor-recovery-"))
    os.environ["TRAINJOB_HOME"] = str(workdir / "home")
    from jobtest.local import processes_under, trainjob_resource

    from trainjob.backends.local.client.backend import LocalBackend

    script = workdir / "train.py"
    script.write_text(TRAIN)
    backend = LocalBackend()
    backend.apply(trainjob_resource("recover", ["torchrun", str(script)], num_nodes=2, num_proc_per_node=1))
    store, job_dir = backend.store, backend.store.job_dir("recover")
    wait_for(lambda: (store.get_job("recover")["step"] or 0) >= 20, timeout=180, interval=0.1)

    kills = []
    for _ in range(args.kills):
        time.sleep(args.interval)
        kills.append(kill_and_time_recovery(store, "recover"))

    (job_dir / "finish").touch()
    job = backend.wait_for_job_status("recover", timeout=120)
    records = store.metrics("recover")
    steps = [r["step"] for r in records]
    times = [r["time"] for r in records]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    median_gap = statistics.median(gaps)
    for kill in kills:
        around = [b - a for a, b in zip(times, times[1:], strict=False) if kill["killed"] - 1 <= b <= kill["killed"] + 3]
        kill["training_stall_s"] = max(around) if around else None
    result = {
        "status": job.status,
        "restarts": job.restarts,
        "steps": len(steps),
        "steps_contiguous_once": steps == list(range(1, len(steps) + 1)),
        "median_step_s": round(median_gap, 4),
        "replaced_s": {"median": round(statistics.median(k["replaced_s"] for k in kills), 3),
                       "max": round(max(k["replaced_s"] for k in kills), 3)},
        "metrics_resumed_s": {"median": round(statistics.median(k["metrics_resumed_s"] for k in kills), 3),
                              "max": round(max(k["metrics_resumed_s"] for k in kills), 3)},
        "max_step_gap_around_kill_s": round(max(k["training_stall_s"] or 0 for k in kills), 3),
        "kills": [{k: round(v, 3) for k, v in kill.items() if k != "killed"} for kill in kills],
    }
    backend.delete_job("recover")
    result["processes_left"] = len(processes_under(workdir))
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
