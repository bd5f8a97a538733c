"""The stall watch, measured on real jobs of the local backend: how long after a rank gets stuck the job is caught,
and whether the stuck rank is the one named.

Each trial is a 2-node job (one process per node, gloo) that reports every ``--step-seconds`` (0.1 s: the issue's
pace); at step 12 rank 1 gets stuck in one of three ways, in turn:

- ``loader``: its data loader's ``__getitem__`` blocks (a stuck mount);
- ``sleep``: the training loop sleeps (a hung call outside any collective);
- ``skip``: rank 1 skips the ``all_reduce`` its peer waits in and waits in a ``barrier`` instead (a
  rank-dependent branch around a collective).

Every trial checks the ``Stalled`` event names rank 1 (``rank 1 is ...``) and measures, from the job's own last
progress report, the seconds until the stall watch fired (the figure in the message) and until the job was Failed.
``--trials`` of them use ``trainjob/stall-timeout: --timeout``; ``--default-trials`` more run with no annotation,
so the limit is derived from the job's pace (the floor: 60 s)::

    python benchmarks/stall.py --trials 9 --default-trials 1 --json /tmp/stall.json

With ``--kubernetes`` the same trials run as TrainJobs on the test control plane (built from Go modules, as the
tests build it; root) under trainjob's operator: the stall watch works from the progress the pods push to the
operator's status endpoint, and the stuck rank is named from the stacks each rank wrote to its own log
(``trainjob.torch.rank_stacks``); the seconds are from the last progress report the pod stamped to the job's
``Failed`` condition, by the API server's clock (whole seconds)::

    python benchmarks/stall.py --kubernetes --trials 9 --default-trials 1
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from compare import report

from trainjob.backends.kubernetes.resources import TRAINJOBS

KINDS = ("loader", "sleep", "skip")
T = TypeVar("T")

SCRIPT = """
import os, sys, time
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
import trainjob.torch as tt

KIND, STEP_SECONDS, STALL_STEP, TOTAL = sys.argv[1], float(sys.argv[2]), 12, 100_000

class Batches(Dataset):
    def __len__(self):
        return TOTAL
    def __getitem__(self, index):
        if KIND == "loader" and index + 1 == STALL_STEP and dist.get_rank() == 1:
            time.sleep(3600)  # blocked in the data loader
        return torch.ones(4)

ctx = tt.init()
for step, batch in enumerate(DataLoader(Batches(), batch_size=1), start=1):
    if step == STALL_STEP and dist.get_rank() == 1:
        if KIND == "sleep":
            time.sleep(3600)  # hung outside any collective
        if KIND == "skip":
            dist.barrier()  # skipped the all_reduce its peer waits in
            time.sleep(3600)
    dist.all_reduce(batch)
    tt.report({"loss": 1.0 / step}, step=step)
    time.sleep(STEP_SECONDS)
"""


def trial(backend: Any, workdir: Path, index: int, kind: str, step_seconds: float, timeout: str | None) -> dict[str, Any]:
    from trainjob.api import TrainJob

    name = f"stall-{index}-{kind}"
    script = workdir / "stall_train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    job = TrainJob.from_dict({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, **({"annotations": {"trainjob/stall-timeout": timeout}} if timeout else {})},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"numNodes": 2, "numProcPerNode": 1,
                             "command": ["torchrun", str(script), kind, str(step_seconds)]}},
    })
    backend.apply(job)
    deadline = time.monotonic() + 300
    while backend.store.get_job(name)["status"] not in ("Failed", "Complete"):
        if time.monotonic() > deadline:
            backend.delete_job(name)
            return {"kind": kind, "limit": timeout or "derived", "named_rank_1": False, "caught_after_s": None,
                    "failed_after_s": None, "message": "not caught in 300 s"}
        time.sleep(0.2)
    row = backend.store.get_job(name)
    events = [e for e in backend.get_job_events(name) if e.reason == "Stalled"]
    metrics = (backend.store.job_dir(name) / "metrics.jsonl").read_text().splitlines()
    last_report = json.loads(metrics[-1])["time"]
    message = events[0].message if events else row["message"]
    silent = re.match(r"no progress for ([0-9.]+) s ", message or "")
    result = {
        "kind": kind,
        "limit": timeout or "derived",
        "named_rank_1": bool(events) and "rank 1 is " in message and "rank 0 is " not in message,
        "caught_after_s": float(silent[1]) if silent else None,
        "failed_after_s": (row["finished"] - last_report) if row.get("finished") else None,
        "message": message,
    }
    backend.delete_job(name)
    return result


def trial_kubernetes(cluster: Any, workdir: Path, index: int, kind: str, step_seconds: float,
                     timeout: str | None) -> dict[str, Any]:
    import datetime

    name, namespace = f"stall-{index}-{kind}", "stall"
    script = workdir / "stall_train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    annotations = {"trainjob/stall-action": "fail", **({"trainjob/stall-timeout": timeout} if timeout else {})}
    cluster.create_job(name, namespace, annotations=annotations, trainer={
        "numNodes": 2, "command": ["torchrun", str(script), kind, str(step_seconds)],  # the training image's
        "resourcesPerNode": {"requests": {"cpu": "100m"}}})
    deadline = time.monotonic() + 300
    while True:
        job = cluster.job(name, namespace)
        done = [c for c in (job.get("status") or {}).get("conditions") or []
                if c["type"] in ("Failed", "Complete") and c["status"] == "True"]
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    message = done[0]["message"] if done else "not caught in 300 s"

    def stamp(text: str) -> float:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    last_report = ((job.get("status") or {}).get("trainerStatus") or {}).get("lastUpdatedTime")
    silent = re.match(r"no progress for ([0-9.]+) s ", message)
    result = {
        "kind": kind,
        "limit": timeout or "derived",
        "named_rank_1": bool(done) and done[0].get("reason") == "Stalled" and "rank 1 is " in message
        and "rank 0 is " not in message,
        "caught_after_s": float(silent[1]) if silent else None,
        "failed_after_s": stamp(done[0]["lastTransitionTime"]) - stamp(last_report) if done and last_report else None,
        "message": message,
    }
    cluster.api.delete(TRAINJOBS, namespace, name, propagation="Background")
    while cluster.pods(name, namespace) and time.monotonic() < deadline + 120:
        time.sleep(0.5)
    return result


def on_test_cluster(tmp: Path, work: Callable[[Any, Path], T]) -> T:
    """``work(cluster, workdir)`` on the test control plane with two real nodes and trainjob's operator (built as
    the tests build them; root), its namespace ``stall`` made; ``workdir`` is where the pods read scripts from."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))
    from kubetest.cluster import TrainJobCluster
    from kubetest.controlplane import ControlPlane

    workdir = tmp / "work"
    workdir.mkdir()
    for path in (tmp, workdir):  # the pods run the script from here
        path.chmod(0o755)
    with ControlPlane.start(tmp / "cluster") as cp:
        (tmp / "trainjob").mkdir()
        cluster = TrainJobCluster(cp, tmp / "trainjob")
        cluster.install()
        cluster.operator.start()
        try:
            cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "stall"}}])
            return work(cluster, workdir)
        finally:
            cluster.operator.stop()


def run_kubernetes(plan: list[tuple[str, str | None]], step_seconds: float, tmp: Path) -> list[dict[str, Any]]:
    return on_test_cluster(tmp, lambda cluster, workdir: [
        trial_kubernetes(cluster, workdir, i, kind, step_seconds, timeout) for i, (kind, timeout) in enumerate(plan)])


def trial_plan(kinds: list[str], trials: int, default_trials: int, timeout: str) -> list[tuple[str, str | None]]:
    """Each trial's stall and ``trainjob/stall-timeout``, the kinds in turn: ``trials`` with ``timeout``, then
    ``default_trials`` with none (the default limit)."""
    plan: list[tuple[str, str | None]] = [(kinds[i % len(kinds)], timeout) for i in range(trials)]
    return plan + [(kinds[i % len(kinds)], None) for i in range(default_trials)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=9, help="trials with an explicit stall-timeout (default 9)")
    parser.add_argument("--default-trials", type=int, default=1,
                        help="trials with the derived limit (each takes about a minute; default 1)")
    parser.add_argument("--timeout", default="5s", help="the explicit trainjob/stall-timeout (default 5s)")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="the jobs' pace (default 0.1)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"which stalls, in turn (default {','.join(KINDS)})")
    parser.add_argument("--kubernetes", action="store_true",
                        help="run the trials as TrainJobs on the test control plane under trainjob's operator")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig

    plan = trial_plan(args.kinds.split(","), args.trials, args.default_trials, args.timeout)
    with tempfile.TemporaryDirectory() as tmp:
        if args.kubernetes:
            results = run_kubernetes(plan, args.step_seconds, Path(tmp))
        else:
            backend = LocalBackend(LocalProcessBackendConfig(home=Path(tmp) / "home"))
            results = [trial(backend, Path(tmp), i, kind, args.step_seconds, timeout)
                       for i, (kind, timeout) in enumerate(plan)]

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        caught = [r["caught_after_s"] for r in rows if r["caught_after_s"] is not None]
        failed = [r["failed_after_s"] for r in rows if r["failed_after_s"] is not None]
        return {"trials": len(rows), "named_correctly": sum(r["named_rank_1"] for r in rows),
                "caught_after_s_median": statistics.median(caught) if caught else None,
                "failed_after_s_median": statistics.median(failed) if failed else None,
                "failed_after_s_max": max(failed) if failed else None}

    report({
        "backend": "kubernetes" if args.kubernetes else "local",
        "step_seconds": args.step_seconds,
        "explicit_timeout": {"timeout": args.timeout, **summary([r for r in results if r["limit"] != "derived"])},
        "derived_limit": summary([r for r in results if r["limit"] == "derived"]),
        "trials": results,
    }, args.json)


if __name__ == "__main__":
    main()
