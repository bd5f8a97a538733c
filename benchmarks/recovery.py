"""What losing a node costs a training run: trainjob's shrink against torchrun's own restart, in the same run.

Three nodes of one process train a tiny model (linear regression, DDP over gloo on CPU, a checkpoint every
``--every`` steps, ``tests/backends/local/elastic_worker.py``). Mid-training, after step ``--kill-after``, one
node's whole process tree is killed with SIGKILL. Measured for each way of running it:

- **recovery**: kill -> the first training step completed after it,
- **steps lost**: steps done before the kill that had to be done again (at most one checkpoint interval),
- **final loss** on the whole data set, next to the uninterrupted run's (the learning rate decays to 0, so an
  intact run ends at the data's noise floor, about 0.01).

Runs:

===================  ===========================================================================================
uninterrupted        ``torchrun --nproc-per-node=3`` with no kill: the reference loss and time
torchrun in place    ``torchrun --nproc-per-node=3 --max-restarts=3``; rank 1 (its process tree) is killed and
                     torchrun restarts all three ranks in place, from the last checkpoint
torchrun nodes       three ``torchrun --nnodes=3 --max-restarts=3`` agents (c10d, node 0 hosts the store); node
                     1's tree is killed and started again at once (a pod restarted with no back-off: the best
                     case); the others wait for it, then all resume from the last checkpoint
trainjob shrink      a local TrainJob, ``elasticPolicy {minNodes: 2, maxNodes: 3}``; node 1's tree (keeper,
                     torchrun, rank) is killed; nodes 0 and 2 go on at world size 2 (lr scaled linearly)
===================  ===========================================================================================

``--repeats N`` runs the two kill runs that are compared (torchrun in place, trainjob shrink) N times each,
interleaved, and compares their medians (the "vs in place" column of each run is against that median).
``--json PATH`` also writes the figures (each run's, and the shrink's recovery against torchrun's in-place
restart as ``recovery.ratio``, target at most 1.0) to a file that ``benchmarks/compare.py`` reads::

    python benchmarks/recovery.py --repeats 3 --json /tmp/recovery.json     # about 5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "backends" / "local" / "elastic_worker.py"
sys.path.insert(0, str(ROOT / "tests" / "harness"))


def read_steps(metrics: Path) -> list[tuple[float, int]]:
    """(time, step) of every step record rank 0 reported so far."""
    found = []
    try:
        lines = metrics.read_text().splitlines()
    except FileNotFoundError:
        return found
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record.get("step"), int):
            found.append((record["time"], record["step"]))
    return found


def wait_for_step(metrics: Path, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not any(s >= step for _, s in read_steps(metrics)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"step {step} not reached in {timeout:g} s")
        time.sleep(0.05)


def kill_tree(pid: int) -> float:
    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
    for process in tree:
        process.kill()
    return time.time()


def outcome(name: str, out: Path, killed: float | None, started: float, ended: float) -> dict:
    steps = read_steps(out / "metrics.jsonl")
    result = {"run": name, "wall": ended - started, "final": json.loads((out / "final.json").read_text())["loss"]}
    if killed is None:
        return result
    after = [(t, s) for t, s in steps if t > killed]
    before = [s for t, s in steps if t <= killed]
    resumed = after[0][1] - 1
    result.update(recovery=after[0][0] - killed, lost=max(before) - resumed, resumed=resumed)
    return result


def worker_env(out: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.update(TRAINJOB_JOB_DIR=str(out), TRAINJOB_METRICS_FILE=str(out / "metrics.jsonl"), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    # Without it torchrun 2.13 hands restarted ranks the store of the attempt before, where they find the old
    # ranks' addresses and hang; trainjob's shrinkable nodes set it too.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def worker_args(args: argparse.Namespace) -> list[str]:
    return [str(WORKER), str(args.steps), str(args.every), "8", "linear"]


def run_torchrun_in_place(args: argparse.Namespace, base: Path, kill: bool, attempt: int = 0) -> dict:
    out = base / (f"torchrun-in-place-{attempt}" if kill else "uninterrupted")
    out.mkdir()
    started = time.time()
    with (out / "torchrun.log").open("wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=3", "--max-restarts=3",
             "--monitor-interval=0.1", "--standalone", f"--log-dir={out / 'torchrun-logs'}", *worker_args(args)],
            env=worker_env(out), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        killed = None
        if kill:
            wait_for_step(out / "metrics.jsonl", args.kill_after)
            rank1 = next(p for p in psutil.Process(agent.pid).children()
                         if p.environ().get("RANK") == "1")
            killed = kill_tree(rank1.pid)
        agent.wait(timeout=300)
    name = "torchrun in place" if kill else "uninterrupted"
    return outcome(name, out, killed, started, time.time())


def run_torchrun_nodes(args: argparse.Namespace, base: Path) -> dict:
    out = base / "torchrun-nodes"
    out.mkdir()
    port = _free_port()
    started = time.time()

    def start(node: int, log) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=3", "--nproc-per-node=1", "--max-restarts=3",
             "--monitor-interval=0.1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
             "--rdzv-id=bench", f"--log-dir={out / 'torchrun-logs'}", *worker_args(args)],
            env={**worker_env(out), "PET_NODE_RANK": str(node)}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)

    with (out / "torchrun.log").open("wb") as log:
        agents = []
        for node in range(3):
            agents.append(start(node, log))
            time.sleep(0.5)  # node 0 first: it hosts the store
        wait_for_step(out / "metrics.jsonl", args.kill_after)
        killed = kill_tree(agents[1].pid)
        agents[1].wait()
        agents[1] = start(1, log)
        for agent in agents:
            agent.wait(timeout=600)
    return outcome("torchrun nodes", out, killed, started, time.time())


def run_trainjob(args: argparse.Namespace, base: Path, attempt: int = 0) -> dict:
    from jobtest.local import elastic_runtime, trainjob_resource

    from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig

    os.environ["TRAINJOB_NODE_BACKOFF_SECONDS"] = "600"  # measure the shrink alone
    backend = LocalBackend(LocalProcessBackendConfig(home=base / f"home-{attempt}"))
    started = time.time()
    backend.apply(trainjob_resource("bench", ["torchrun", *worker_args(args)], runtime="torch-shrink"),
                  [elastic_runtime("torch-shrink", min_nodes=2, max_nodes=3, max_restarts=3)])
    job_dir = backend.store.job_dir("bench")
    try:
        wait_for_step(job_dir / "metrics.jsonl", args.kill_after)
        keeper = next(r["pid"] for r in backend.store.nodes("bench") if r["idx"] == 1)
        killed = kill_tree(keeper)
        job = backend.wait_for_job_status("bench", timeout=600)
        ended = time.time()
        if job.status != "Complete":
            raise RuntimeError(f"the job ended {job.status}: {job.message}")
        resized = [e.message for e in backend.get_job_events("bench") if e.reason == "Resized"]
        result = outcome("trainjob shrink", job_dir, killed, started, ended)
        result["note"] = "; ".join(resized)
        return result
    finally:
        backend.delete_job("bench")


def _free_port() -> int:
    from trainjob.backends.local.process_specs import free_port

    return free_port()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--every", type=int, default=10, help="checkpoint interval, in steps")
    parser.add_argument("--kill-after", type=int, default=13, help="kill once rank 0 reported this step")
    parser.add_argument("--repeats", type=int, default=1,
                        help="kill runs of torchrun in place and trainjob shrink, interleaved; medians are compared")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="recovery-") as tmp:
        base = Path(tmp)
        results.append(run_torchrun_in_place(args, base, kill=False))
        for attempt in range(args.repeats):
            results.append(run_torchrun_in_place(args, base, kill=True, attempt=attempt))
            results.append(run_trainjob(args, base, attempt=attempt))
        results.append(run_torchrun_nodes(args, base))
    reference = results[0]
    baseline = {"recovery": median_recovery(results, "torchrun in place")}
    print(f"\n{args.steps} steps, checkpoint every {args.every}, node 1 killed after step {args.kill_after}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n")
    print(f"{'run':<20}{'recovery s':>12}{'vs in place':>13}{'steps lost':>12}{'final loss':>12}{'vs intact':>11}"
          f"{'wall s':>9}")
    for r in results:
        recovery = f"{r['recovery']:.1f}" if "recovery" in r else "-"
        ratio = f"{r['recovery'] / baseline['recovery']:.2f}x" if "recovery" in r else "-"
        lost = str(r["lost"]) if "lost" in r else "-"
        print(f"{r['run']:<20}{recovery:>12}{ratio:>13}{lost:>12}{r['final']:>12.4f}"
              f"{r['final'] / reference['final']:>10.2f}x{r['wall']:>9.1f}")
    for r in results:
        if r.get("note"):
            print(f"\n{r['run']}: {r['note']}")
    if args.json:
        args.json.write_text(json.dumps(figures(results), indent=2) + "\n")


def median_recovery(results: list[dict], run: str) -> float:
    return statistics.median(r["recovery"] for r in results if r["run"] == run)


def figures(results: list[dict]) -> dict:
    """The JSON form: the shrink's recovery next to torchrun's in-place restart (medians over ``--repeats``),
    and every run's figures."""
    shrinks = [r for r in results if r["run"] == "trainjob shrink"]
    in_place = median_recovery(results, "torchrun in place")
    shrink = median_recovery(results, "trainjob shrink")
    intact = next(r for r in results if r["run"] == "uninterrupted")["final"]
    return {
        "recovery": {
            "repeats": len(shrinks),
            "torchrun_in_place_s": in_place,
            "torchrun_nodes_s": median_recovery(results, "torchrun nodes"),
            "trainjob_shrink_s": shrink,
            "ratio": shrink / in_place,
            "trainjob_steps_lost": max(r["lost"] for r in shrinks),
            "trainjob_final_vs_intact": max(r["final"] for r in shrinks) / intact,
        },
        "runs": results,
    }


if __name__ == "__main__":
    main()
