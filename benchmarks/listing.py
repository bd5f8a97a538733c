"""The cost of listing a large store: ``trainjob list`` over 10,000 jobs, as a command and in this process.

A store is filled with ``--jobs`` finished jobs (half of them with a metrics record), then, median of ``--runs``:

- ``list_in_process_s``: the listing itself (store query and table) in this process, no start-up;
- ``list_command_s``: ``trainjob list`` as a user runs it (target: at most 0.2 s);
- ``list_json_command_s``: ``trainjob list -o json`` as a command (target: at most 0.15 s);
- ``sdk_list_jobs_s``: the SDK's ``list_jobs()`` in this process (target: at most 0.15 s);
- ``cli_startup_s`` and ``python_startup_s``, for scale: ``trainjob --version`` and a bare ``python -c pass``.

Commands are timed interleaved (list, list -o json, --version, python, list, ...) so load on a shared machine
falls on each alike. ``--json PATH`` also writes the figures to a file that ``benchmarks/compare.py`` reads::

    python benchmarks/listing.py --runs 9 --json /tmp/listing.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compare import report  # the figures' JSON, as compare.py reads it


def time_command(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def fill_store(home: Path, count: int) -> None:
    """``count`` finished or suspended jobs in the store under ``home``; every other one has a metrics record."""
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
    """The figures described in the module docstring, in seconds (medians)."""
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
    commands = {
        "list_command_s": [trainjob, "list"],
        "list_json_command_s": [trainjob, "list", "-o", "json"],
        "cli_startup_s": [trainjob, "--version"],
        "python_startup_s": [sys.executable, "-c", "pass"],
    }
    times: dict[str, list[float]] = {key: [] for key in commands}
    for _ in range(runs):
        for key, argv in commands.items():
            times[key].append(time_command(argv, env, workdir))
    return {
        "jobs": count,
        "list_in_process_s": statistics.median(in_process),
        "sdk_list_jobs_s": statistics.median(sdk),
        **{key: statistics.median(values) for key, values in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainjob-bench-") as tmp:
        results = {"list": list_cost(args.jobs, args.runs, Path(tmp))}
    report(results, args.json)


if __name__ == "__main__":
    main()
