"""Launch overhead of the local backend and the cost of listing a large store.

1. Wall time from ``trainjob run`` to ``Complete`` for a trivial 2 nodes x 2 processes job (gloo process group,
   one barrier), against plain ``torchrun`` doing the same (two node launchers started side by side), median of
   ``--runs`` interleaved runs each, as a ratio (target: at most 1.15); also the ratio of the fastest runs.
2. ``trainjob list`` over a store holding 10,000 jobs: the listing itself (store query, table) in this process,
   the whole command as a user runs it (target: under 0.2 s) and, for scale, the interpreter and CLI start-up
   alone (``trainjob --version``) and the SDK's ``list_jobs()``.

    python benchmarks/launch.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TRIVIAL = textwrap.dedent("""
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
""")


def time_command(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def time_plain_torchrun(script: Path, env: dict[str, str], cwd: Path) -> float:
    from trainjob.backends.local.process_specs import free_port

    port = str(free_port())
    started = time.perf_counter()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
             "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", port,
             "--log-dir", str(cwd / "torchrun-logs"), str(script)],
            env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for rank in (0, 1)
    ]
    if any(node.wait() != 0 for node in nodes):
        raise RuntimeError("plain torchrun failed")
    return time.perf_counter() - started


def launch_overhead(runs: int, workdir: Path) -> dict[str, float]:
    script = workdir / "trivial.py"
    script.write_text(TRIVIAL)
    env = {**os.environ, "TRAINJOB_HOME": str(workdir / "home"), "OMP_NUM_THREADS": "1"}
    trainjob = str(Path(sys.executable).with_name("trainjob"))
    ours, plain, before_nodes, after_nodes = [], [], [], []
    for run in range(runs):
        plain.append(time_plain_torchrun(script, env, workdir))
        started = time.time()
        ours.append(time_command([trainjob, "run", str(script), "--nodes", "2", "--nproc-per-node", "2",
                                  "--name", f"trivial-{run}"], env, workdir))
        nodes_started, nodes_exited = node_times(workdir / "home", f"trivial-{run}")
        before_nodes.append(nodes_started - started)
        after_nodes.append(started + ours[-1] - nodes_exited)
    return {
        "trainjob_run_median_s": statistics.median(ours),
        "plain_torchrun_median_s": statistics.median(plain),
        "ratio": statistics.median(ours) / statistics.median(plain),
        # On a shared machine the fastest runs are the ones least disturbed by other load.
        "ratio_of_fastest": min(ours) / min(plain),
        # Where trainjob's extra time goes: command start to node processes started, last node exit to exit.
        "command_to_nodes_started_median_s": statistics.median(before_nodes),
        "nodes_exited_to_command_exit_median_s": statistics.median(after_nodes),
    }


def node_times(home: Path, name: str) -> tuple[float, float]:
    """When the job's node processes were started and when the last one exited, from the store."""
    from trainjob.backends.local.store import Store

    store = Store.open(home)
    nodes = store.nodes(name)
    started = min(node["started"] for node in nodes)
    exited = max(node["finished"] for node in nodes)
    store.close()
    return started, exited


def fill_store(home: Path, count: int) -> None:
    from trainjob.backends.local.store import Store

    store = Store.open(home)
    now = time.time()
    with store.transaction():
        for i in range(count):
            status = ("Complete", "Failed", "Complete", "Suspended")[i % 4]
            store.insert_job({
                "name": f"job-{i:05d}", "namespace": "default", "uid": f"uid-{i}", "status": status,
                "reason": status, "message": None, "runtime": "torch-distributed", "num_nodes": 2,
                "num_proc_per_node": 2, "created": now - count + i, "started": now - count + i + 1,
                "finished": now - count + i + 30 if status != "Suspended" else None,
                "resource": {"kind": "TrainJob", "metadata": {"name": f"job-{i:05d}"}}, "launch": {"nodes": []},
            })
    for i in range(0, count, 2):
        store.add_metrics(f"job-{i:05d}", [{"time": now, "step": 50, "total_steps": 100, "metrics": {"loss": 0.5}}])
    store.close()


def list_cost(count: int, runs: int, workdir: Path) -> dict[str, float]:
    from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
    from trainjob.cli.jobs_format import LIST_HEADER, summary_rows, table

    home = workdir / "list-home"
    fill_store(home, count)
    backend = LocalBackend(LocalProcessBackendConfig(home=home))
    in_process, sdk = [], []
    for _ in range(runs):
        started = time.perf_counter()
        text = table(LIST_HEADER, summary_rows(backend.list_summaries(), time.time()))
        in_process.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert len(backend.list_jobs()) == count
        sdk.append(time.perf_counter() - started)
    assert text.count("\n") == count
    env = {**os.environ, "TRAINJOB_HOME": str(home)}
    trainjob = str(Path(sys.executable).with_name("trainjob"))
    command = [time_command([trainjob, "list"], env, workdir) for _ in range(runs)]
    startup = [time_command([trainjob, "--version"], env, workdir) for _ in range(runs)]
    return {
        "jobs": count,
        "list_in_process_median_s": statistics.median(in_process),
        "sdk_list_jobs_median_s": statistics.median(sdk),
        "list_command_median_s": statistics.median(command),
        "cli_startup_median_s": statistics.median(startup),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainjob-bench-") as tmp:
        workdir = Path(tmp)
        results = {"launch": launch_overhead(args.runs, workdir), "list": list_cost(args.jobs, args.runs, workdir)}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
