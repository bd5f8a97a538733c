"""The stall watch on scripts that never report progress (plain torchrun scripts, no ``trainjob.torch``), on
real jobs of the local backend: how long after rank 1 gets stuck the stall is announced, whether rank 1 is the
rank named, and what the per-rank collective signal costs each collective.

**Announcement.** Each trial is a 2-node job (one process per node, gloo) of the plain kind: an ``all_reduce``
every 0.1 s, rank 0 printing ``step N`` every fifth step. At step 20 rank 1 gets stuck in one of four ways, in
turn: ``sleep`` (``time.sleep`` in the loop), ``loader`` (its data loader's ``__getitem__`` blocks), ``skip`` (it
skips an ``all_reduce`` and at the end waits in a ``barrier`` while rank 0 waits in its last ``all_reduce``), or
``ddp`` (a DDP model and no explicit collective; rank 1 stops before its forward). Rank 1 writes the time it got
stuck; the figure is the time from then to the first ``Stalled`` event, which must name rank 1 (``rank 1 is``) and
not rank 0. ``--trials`` use ``trainjob/stall-timeout: --timeout``; ``--default-trials`` more use no annotation,
so the default limit for a job that does not report (5 minutes, ``trainjob.backends.stall``)::

    python benchmarks/stall_any_script.py --trials 8 --default-trials 0 --json /tmp/stall-any.json

``--slow-by-design`` adds one job in which rank 0 evaluates for ``--eval-seconds`` (90) while rank 1 waits at a
barrier, with a limit of ``--eval-limit`` (120 s): no ``Stalled`` event may come.

With ``--kubernetes`` the trials (and ``--slow-by-design``'s job) run as TrainJobs of 2 pods on the test cluster's
real nodes (built from Go modules as the tests build them; root) under trainjob's operator, from the training image,
which has trainjob and ``trainjob-site.pth``: each rank posts its collectives to the operator and writes its stacks
to its log when they stop (``trainjob.pod_site``). Rank 1's stall time comes from its pod's log, the announcement is
when the first ``Stalled`` event is seen (polled every second); no overhead runs::

    python benchmarks/stall_any_script.py --kubernetes --trials 10 --timeout 20s --slow-by-design

**Overhead.** A gloo job under plain ``torchrun`` (1 rank, where a collective costs only its own bookkeeping, and
2 ranks) runs ``--collectives`` 1-element ``all_reduce`` calls and half as many DDP steps of a small model (whose
all-reduces DDP issues from C++), in three set-ups, in turn, ``--overhead-runs`` times each: ``baseline``, plain
torchrun without the local backend's worker site (torch's defaults, its flight recorder on); ``signal``, with the
worker site as jobs get it (the flight recorder's counts read by a thread); and ``no_flight_recorder``, the worker
site with ``TORCH_FR_BUFFER_SIZE=0`` (what the recorder's entry per collective costs, which torch pays by default;
no signal then). The figures are the best microseconds per collective and per DDP step of each, by the clock and in
CPU time (rank 0's process, all its threads: what a loaded machine distorts least), and the ratios signal /
baseline and signal / no_flight_recorder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from compare import report
from stall import on_test_cluster, trial_plan

KINDS = ("sleep", "loader", "skip", "ddp")

SCRIPT = """
import os, sys, time
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

KIND, STALL_STEP, TOTAL = sys.argv[1], 20, 100_000

def stuck():
    if "TRAINJOB_JOB_DIR" not in os.environ:  # a pod: the time goes to its log
        print(f"rank 1 stalls at {time.time()!r}", flush=True)
        return
    with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], "stalled-at"), "w") as f:
        f.write(repr(time.time()))

class Batches(Dataset):
    def __len__(self):
        return TOTAL
    def __getitem__(self, index):
        if KIND == "loader" and index + 1 == STALL_STEP and dist.get_rank() == 1:
            stuck()
            time.sleep(3600)  # blocked in the data loader
        return torch.ones(4)

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1)) if KIND == "ddp" else None
steps = 40 if KIND == "skip" else TOTAL
for step, batch in enumerate(DataLoader(Batches(), batch_size=1), start=1):
    if step > steps:
        break
    if step == STALL_STEP and dist.get_rank() == 1:
        if KIND in ("sleep", "ddp"):
            stuck()
            time.sleep(3600)  # hung outside any collective
        if KIND == "skip":
            continue  # skipped the all_reduce its peer waits in
    if model is not None:
        model(batch).sum().backward()
    else:
        dist.all_reduce(batch)
    if dist.get_rank() == 0 and step % 5 == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.1)
if dist.get_rank() == 1:
    stuck()  # skip: waits in the barrier from here
dist.barrier()
"""

SLOW = """
import os, sys, time
import torch, torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
for _ in range(20):
    dist.all_reduce(t)
    time.sleep(0.1)
if dist.get_rank() == 0:
    time.sleep(float(sys.argv[1]))  # evaluating while the others wait at the barrier
dist.barrier()
for _ in range(20):
    dist.all_reduce(t)
"""

OVERHEAD = """
import os, sys, time, json
import torch, torch.distributed as dist

COLLECTIVES = int(sys.argv[1])
dist.init_process_group("gloo")
t = torch.ones(1)
for _ in range(100):
    dist.all_reduce(t)
dist.barrier()
started, cpu = time.perf_counter(), time.process_time()
for _ in range(COLLECTIVES):
    dist.all_reduce(t)
per_collective = (time.perf_counter() - started) / COLLECTIVES
cpu_per_collective = (time.process_time() - cpu) / COLLECTIVES
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))  # its all-reduces come from C++
batch = torch.randn(8, 64)
for _ in range(20):
    model(batch).sum().backward()
dist.barrier()
started, cpu = time.perf_counter(), time.process_time()
for _ in range(COLLECTIVES // 2):
    model(batch).sum().backward()
per_step = (time.perf_counter() - started) / (COLLECTIVES // 2)
cpu_per_step = (time.process_time() - cpu) / (COLLECTIVES // 2)
if dist.get_rank() == 0:
    print(json.dumps({"collective_us": per_collective * 1e6, "collective_cpu_us": cpu_per_collective * 1e6,
                      "ddp_step_us": per_step * 1e6, "ddp_step_cpu_us": cpu_per_step * 1e6}))
sys.stdout.flush()
os._exit(0)  # gloo sometimes aborts in the interpreter's teardown; the figures are out
"""


def _job(name: str, command: list[str], annotations: dict[str, str]) -> Any:
    from trainjob.api import TrainJob

    return TrainJob.from_dict({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"numNodes": 2, "numProcPerNode": 1, "command": ["torchrun", *command]}},
    })


def trial(backend: Any, workdir: Path, index: int, kind: str, timeout: str | None, wait: float) -> dict[str, Any]:
    name = f"stall-{index}-{kind}"
    script = workdir / "hang.py"
    script.write_text(textwrap.dedent(SCRIPT))
    backend.apply(_job(name, [str(script), kind], {"trainjob/stall-timeout": timeout} if timeout else {}))
    deadline = time.monotonic() + wait
    events: list[Any] = []
    while not events and time.monotonic() < deadline:
        time.sleep(0.2)
        events = [e for e in backend.get_job_events(name) if e.reason == "Stalled"]
    stalled_at_file = backend.store.job_dir(name) / "stalled-at"
    stalled_at = float(stalled_at_file.read_text()) if stalled_at_file.exists() else None
    message = events[0].message if events else f"not announced in {wait:g} s"
    silent = re.match(r"no collective completed for ([0-9.]+) s ", message)
    result = {
        "kind": kind,
        "limit": timeout or "default",
        "named_rank_1": bool(events) and "rank 1 is " in message and "rank 0 is " not in message,
        "announced_after_s": events[0].event_time.timestamp() - stalled_at if events and stalled_at else None,
        "waited_s": float(silent[1]) if silent else None,
        "message": message,
    }
    backend.delete_job(name)
    return result


def trial_kubernetes(cluster: Any, workdir: Path, index: int, kind: str, timeout: str | None,
                     wait: float) -> dict[str, Any]:
    """One trial as a TrainJob on the test cluster: the time rank 1 got stuck from its pod's log, the announcement
    when the first ``Stalled`` event is seen (polled every second)."""
    name, namespace = f"stall-{index}-{kind}", "stall"
    script = workdir / "hang.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cluster.create_job(name, namespace, annotations={"trainjob/stall-timeout": timeout} if timeout else None,
                       trainer={"numNodes": 2, "command": ["torchrun", str(script), kind],
                                "resourcesPerNode": {"requests": {"cpu": "100m"}}})
    deadline = time.monotonic() + wait + 120  # and the pods' start
    events: list[dict[str, Any]] = []
    stalled_at: float | None = None
    seen_at: float | None = None
    while not events and time.monotonic() < deadline:
        time.sleep(1.0)
        if stalled_at is None:
            logs = cluster.kubectl("logs", "-n", namespace, "-l", f"jobset.sigs.k8s.io/jobset-name={name}",
                                   "--tail=-1", check=False).stdout
            found = re.search(r"rank 1 stalls at ([0-9.]+)", logs)
            stalled_at = float(found[1]) if found else None
        listed = cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                                 f"involvedObject.name={name},reason=Stalled", "-o", "json", check=False).stdout
        events = json.loads(listed or '{"items": []}')["items"]
        seen_at = time.time() if events else None
    message = events[0]["message"] if events else f"not announced in {wait:g} s"
    silent = re.match(r"no collective completed for ([0-9.]+) s ", message)
    result = {
        "kind": kind,
        "limit": timeout or "default",
        "named_rank_1": bool(events) and "rank 1 is " in message and "rank 0 is " not in message,
        "announced_after_s": seen_at - stalled_at if seen_at and stalled_at else None,
        "waited_s": float(silent[1]) if silent else None,
        "message": message,
    }
    cluster.kubectl("delete", "trainjob", "-n", namespace, name, "--wait=false", check=False)
    while cluster.pods(name, namespace) and time.monotonic() < deadline + 120:
        time.sleep(0.5)
    return result


def slow_by_design_kubernetes(cluster: Any, workdir: Path, eval_seconds: float, limit: float) -> dict[str, Any]:
    script = workdir / "slow.py"
    script.write_text(textwrap.dedent(SLOW))
    cluster.create_job("slow", "stall", annotations={"trainjob/stall-timeout": f"{limit:g}s"},
                       trainer={"numNodes": 2, "command": ["torchrun", str(script), str(eval_seconds)],
                                "resourcesPerNode": {"requests": {"cpu": "100m"}}})
    cluster.wait_for_condition("slow", "Complete", namespace="stall", timeout=eval_seconds + 300)
    listed = cluster.kubectl("get", "events", "-n", "stall", "--field-selector",
                             "involvedObject.name=slow,reason=Stalled", "-o", "json").stdout
    stalled = [e["message"] for e in json.loads(listed)["items"]]
    return {"eval_seconds": eval_seconds, "limit": limit, "stalled_events": len(stalled), "messages": stalled}


def slow_by_design(backend: Any, workdir: Path, eval_seconds: float, limit: float) -> dict[str, Any]:
    script = workdir / "slow.py"
    script.write_text(textwrap.dedent(SLOW))
    backend.apply(_job("slow", [str(script), str(eval_seconds)], {"trainjob/stall-timeout": f"{limit:g}s"}))
    backend.wait_for_job_status("slow", {"Complete"}, timeout=eval_seconds + 300, polling_interval=0.5)
    stalled = [e.message for e in backend.get_job_events("slow") if e.reason == "Stalled"]
    backend.delete_job("slow")
    return {"eval_seconds": eval_seconds, "limit": limit, "stalled_events": len(stalled), "messages": stalled}


def overhead(workdir: Path, collectives: int, runs: int, ranks: int) -> dict[str, Any]:
    from trainjob.backends.local.worker_site import SITE_DIR, STACKS_DIR_ENV, STACKS_SIGNAL, STACKS_SIGNAL_ENV

    script = workdir / "overhead.py"
    script.write_text(textwrap.dedent(OVERHEAD))
    bare = {key: value for key, value in os.environ.items() if not key.startswith(("TORCH_FR_", "TRAINJOB_"))}
    bare.pop("PYTHONPATH", None)
    bare["OMP_NUM_THREADS"] = "1"  # as torchrun sets it for 2 ranks, and local jobs get it for theirs
    site = {**bare, "PYTHONPATH": SITE_DIR, STACKS_DIR_ENV: str(workdir / "stacks"),
            STACKS_SIGNAL_ENV: str(int(STACKS_SIGNAL))}
    setups = {"baseline": bare, "signal": site, "no_flight_recorder": {**site, "TORCH_FR_BUFFER_SIZE": "0"}}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    seen: dict[str, list[dict[str, float]]] = {label: [] for label in setups}
    for _ in range(runs):
        for label, env in setups.items():
            done = subprocess.run([*torchrun, str(script), str(collectives)], env=env, capture_output=True,
                                  text=True, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"{label} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
            seen[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = {label: {key: min(run[key] for run in rows) for key in rows[0]} for label, rows in seen.items()}
    return {
        "collectives_per_run": collectives,
        "runs_each": runs,
        **best,
        **{f"{figure}_ratio": best["signal"][figure] / best["baseline"][figure] for figure in best["signal"]},
        **{f"{figure}_ratio_vs_no_flight_recorder": best["signal"][figure] / best["no_flight_recorder"][figure]
           for figure in best["signal"]},
        "signal_files_written": len(list((workdir / "stacks").glob("collectives-rank-*.json"))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="trials with an explicit stall-timeout (default 8)")
    parser.add_argument("--default-trials", type=int, default=0,
                        help="trials with the default limit (each takes over 5 minutes; default 0)")
    parser.add_argument("--timeout", default="10s", help="the explicit trainjob/stall-timeout (default 10s)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"which stalls, in turn (default {','.join(KINDS)})")
    parser.add_argument("--slow-by-design", action="store_true", help="add the job whose rank 0 evaluates")
    parser.add_argument("--eval-seconds", type=float, default=90.0, help="rank 0's evaluation (default 90)")
    parser.add_argument("--eval-limit", type=float, default=120.0, help="its stall-timeout in s (default 120)")
    parser.add_argument("--collectives", type=int, default=2000, help="collectives per overhead run (default 2000)")
    parser.add_argument("--overhead-runs", type=int, default=5, help="overhead runs of each kind (default 5)")
    parser.add_argument("--overhead-ranks", default="1,2", help="world sizes of the overhead runs (default 1,2)")
    parser.add_argument("--kubernetes", action="store_true",
                        help="the trials and the slow job as TrainJobs on the test cluster (root; no overhead runs)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    plan = trial_plan(args.kinds.split(","), args.trials, args.default_trials, args.timeout)
    cost: Any = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.kubernetes:
            def work(cluster: Any, workdir: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
                rows = [trial_kubernetes(cluster, workdir, i, kind, timeout, wait=(360.0 if timeout is None else 120.0))
                        for i, (kind, timeout) in enumerate(plan)]
                return rows, (slow_by_design_kubernetes(cluster, workdir, args.eval_seconds, args.eval_limit)
                              if args.slow_by_design else None)

            results, slow = on_test_cluster(Path(tmp), work)
        else:
            results, slow, cost = run_local(args, plan, Path(tmp))

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        after = [r["announced_after_s"] for r in rows if r["announced_after_s"] is not None]
        return {"trials": len(rows), "named_correctly": sum(r["named_rank_1"] for r in rows),
                "announced_after_s_median": statistics.median(after) if after else None,
                "announced_after_s_max": max(after) if after else None}

    report({
        "backend": "kubernetes" if args.kubernetes else "local",
        "explicit_timeout": {"timeout": args.timeout, **summary([r for r in results if r["limit"] != "default"])},
        "default_limit": summary([r for r in results if r["limit"] == "default"]),
        "slow_by_design": slow,
        "overhead": cost,
        "trials": results,
    }, args.json)


def run_local(args: argparse.Namespace, plan: list[tuple[str, str | None]], tmp: Path) -> tuple[Any, Any, Any]:
    """The trials, the slow job and the overhead runs on the local backend."""
    from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig

    backend = LocalBackend(LocalProcessBackendConfig(home=tmp / "home"))
    results = [trial(backend, tmp, i, kind, timeout, wait=(360.0 if timeout is None else 120.0))
               for i, (kind, timeout) in enumerate(plan)]
    slow = slow_by_design(backend, tmp, args.eval_seconds, args.eval_limit) if args.slow_by_design else None
    cost = {f"{ranks}_ranks": overhead(tmp, args.collectives, args.overhead_runs, ranks)
            for ranks in map(int, args.overhead_ranks.split(","))} if args.overhead_runs else None
    return results, slow, cost


if __name__ == "__main__":
    main()
