"""Launch overhead of the local backend: ``trainjob run`` of a trivial job against plain ``torchrun``.

Wall time from ``trainjob run`` to ``Complete`` for a trivial 2 nodes x 2 processes job (gloo process group, one
barrier), against plain ``torchrun`` doing the same (two node launchers started side by side), median of
``--runs`` interleaved runs each (torchrun, trainjob, torchrun, ...), as a ratio (target: at most 1.05); also the
ratio of the fastest runs. Where the time goes, as medians:

- ``*_to_first_init_s``: from the command to the first rank reaching ``init_process_group`` (each rank writes
  the time it got there into a directory named on its command line), for both;
- ``command_to_nodes_started_s`` and ``nodes_exited_to_command_exit_s``: trainjob's own time before its node
  processes start and after the last one exits, from the store;
- ``trainjob_cpu_s``, ``torchrun_cpu_s`` and ``cpu_ratio``: the CPU time (user and system) of every process of a
  run, the command's supervisor, keepers and torchruns (warm ones too) included (this script adopts the processes that outlive
  their parents and reaps them before the next run starts). On a machine with few cores a run is CPU-bound, so
  the CPU a run adds is what its wall time pays there; and it varies far less from run to run than wall time.

``--json PATH`` also writes the figures to a file that ``benchmarks/compare.py`` reads. On a shared machine two
runs of this script minutes apart can differ by more than a change does, so ``--baseline-src DIR`` (the ``src``
folder of another checkout, a release say) times that tree's ``trainjob run`` in the same loop as well (torchrun,
baseline, this tree, torchrun, ...), and ``--baseline-json PATH`` writes its figures for ``compare.py``. The cost of
listing a large store is ``benchmarks/listing.py``::

    python benchmarks/launch.py --runs 9 --json /tmp/launch.json
    git worktree add /tmp/release v0.1.0
    python benchmarks/launch.py --baseline-src /tmp/release/src --baseline-json /tmp/base.json --json /tmp/change.json
    python benchmarks/compare.py /tmp/base.json /tmp/change.json
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from compare import report
from listing import fill_store, time_command  # noqa: F401  (ui_joblist.py takes both from here)

TRIVIAL = textwrap.dedent("""
    import os, sys, time
    import torch.distributed as dist
    stamp = os.path.join(sys.argv[1], os.environ["RANK"])
    with open(stamp, "w") as f:
        f.write(repr(time.time()))
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
""")

#: What the installed ``trainjob`` script runs: the command's entry point (``console``; ``main`` in older trees).
LAUNCHER = textwrap.dedent("""
    import sys
    from trainjob.cli import main as cli
    sys.exit(getattr(cli, "console", cli.main)())
""")


#: ``prctl`` option: orphaned descendants are re-parented to this process, so their CPU time is counted here.
PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> None:
    """Become the parent of this script's orphaned descendants (Linux), so :func:`children_cpu` counts them."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def children_cpu(timeout: float = 30.0) -> float:
    """CPU seconds of every descendant so far, once all have ended (a job's supervisor exits just after its
    command: it is waited for, up to ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.01)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def first_init(stamps: Path) -> float:
    """The earliest time a rank wrote into ``stamps`` (just before its ``init_process_group``)."""
    return min(float(path.read_text()) for path in stamps.iterdir())


def time_plain_torchrun(script: Path, env: dict[str, str], cwd: Path, stamps: Path) -> tuple[float, float]:
    from trainjob.backends.local.process_specs import free_port

    port = str(free_port())
    wall_started, started = time.time(), time.perf_counter()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
             "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", port,
             "--log-dir", str(cwd / "torchrun-logs"), str(script), str(stamps)],
            env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for rank in (0, 1)
    ]
    if any(node.wait() != 0 for node in nodes):
        raise RuntimeError("plain torchrun failed")
    return time.perf_counter() - started, first_init(stamps) - wall_started


def launch_overhead(runs: int, workdir: Path, baseline_src: Path | None = None) -> dict[str, dict[str, float]]:
    """The figures of the module docstring for this tree (``"launch"``) and, with ``baseline_src``, for the
    trainjob in that ``src`` folder (``"baseline"``), each against the same interleaved torchrun runs."""
    script = workdir / "trivial.py"
    script.write_text(TRIVIAL)
    env = {**os.environ, "TRAINJOB_HOME": str(workdir / "home"), "OMP_NUM_THREADS": "1"}
    trees = {"launch": env}
    if baseline_src is not None:  # its supervisor, keepers and node site come from that tree too (same PYTHONPATH)
        trees = {"baseline": {**env, "PYTHONPATH": str(baseline_src.resolve())}, **trees}
    # The installed ``trainjob`` script names this tree's entry point; a baseline tree may name another, so both
    # run through a launcher of the same form that takes whichever the tree on its path has.
    launcher = workdir / "trainjob-command.py"
    launcher.write_text(LAUNCHER)
    trainjob = [sys.executable, str(launcher)]
    plain, plain_init, plain_cpu = [], [], []
    ours: dict[str, dict[str, list[float]]] = {
        tree: {"run": [], "init": [], "before": [], "after": [], "cpu": []} for tree in trees
    }
    adopt_orphans()
    cpu = children_cpu()
    for run in range(runs):
        stamps = workdir / f"torchrun-stamps-{run}"
        stamps.mkdir()
        wall, init = time_plain_torchrun(script, env, workdir, stamps)
        plain.append(wall)
        plain_init.append(init)
        cpu, used = children_cpu(), cpu
        plain_cpu.append(cpu - used)
        for tree, tree_env in trees.items():
            name = f"{tree}-{run}"
            stamps = workdir / f"{name}-stamps"
            stamps.mkdir()
            started = time.time()
            figures = ours[tree]
            figures["run"].append(time_command([*trainjob, "run", str(script), "--nodes", "2", "--nproc-per-node", "2",
                                                "--name", name, "--", str(stamps)], tree_env, workdir))
            figures["init"].append(first_init(stamps) - started)
            nodes_started, nodes_exited = node_times(workdir / "home", name)
            figures["before"].append(nodes_started - started)
            figures["after"].append(started + figures["run"][-1] - nodes_exited)
            cpu, used = children_cpu(), cpu
            figures["cpu"].append(cpu - used)
    return {
        tree: {
            "runs": runs,
            "trainjob_run_s": statistics.median(figures["run"]),
            "plain_torchrun_s": statistics.median(plain),
            "ratio": statistics.median(figures["run"]) / statistics.median(plain),
            # On a shared machine the fastest runs are the ones least disturbed by other load.
            "ratio_of_fastest": min(figures["run"]) / min(plain),
            "trainjob_to_first_init_s": statistics.median(figures["init"]),
            "torchrun_to_first_init_s": statistics.median(plain_init),
            # Where trainjob's extra time goes: command start to node processes started, last node exit to exit.
            "command_to_nodes_started_s": statistics.median(figures["before"]),
            "nodes_exited_to_command_exit_s": statistics.median(figures["after"]),
            "trainjob_cpu_s": statistics.median(figures["cpu"]),
            "torchrun_cpu_s": statistics.median(plain_cpu),
            "cpu_ratio": statistics.median(figures["cpu"]) / statistics.median(plain_cpu),
        }
        for tree, figures in ours.items()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--baseline-src", type=Path, metavar="DIR",
                        help="the src folder of another trainjob checkout, timed in the same loop")
    parser.add_argument("--baseline-json", type=Path, metavar="PATH",
                        help="with --baseline-src: write the baseline's figures to this file")
    args = parser.parse_args()
    if args.baseline_src is not None and not (args.baseline_src / "trainjob" / "__init__.py").is_file():
        parser.error(f"--baseline-src: no trainjob package in {args.baseline_src} (give the src folder of a checkout)")
    if args.baseline_json is not None and args.baseline_src is None:
        parser.error("--baseline-json: needs --baseline-src")
    with tempfile.TemporaryDirectory(prefix="trainjob-bench-") as tmp:
        results = launch_overhead(args.runs, Path(tmp), args.baseline_src)
    if "baseline" in results:
        report({"launch": results["baseline"]}, args.baseline_json)
    report({"launch": results["launch"]}, args.json)


if __name__ == "__main__":
    main()
