"""The detached process that owns one job's node processes: ``python -m trainjob.backends.local.supervisor HOME NAME``.

It starts one process per node, watches them, ingests the metrics rank 0 writes, enforces
``activeDeadlineSeconds``, honours suspend requests, restarts the node group of an elastic job up to
``maxRestarts`` and writes every transition to the store. A job's status only moves
``Created -> Running -> Complete | Failed`` (or ``Suspended``); the supervisor writes it before it exits, so a
reader that finds the supervisor gone while the job is still active knows it was killed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from trainjob.backends.local import launcher, logs, processes
from trainjob.backends.local.environment import PackageInstallError, prepare_environment
from trainjob.backends.local.launcher import LaunchSpec
from trainjob.backends.local.store import Store

POLL_SECONDS = 0.05
#: After the first node fails, how long to wait for the others' own reports before choosing the root cause.
FAILURE_SETTLE_SECONDS = 1.5
NODE_STOP_GRACE_SECONDS = 3.0


class Supervisor:
    """Runs one job to its end: ``Supervisor(Store.open(home), "mnist").run()``."""

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = name
        self.row = store.get_job(name)
        self.spec = LaunchSpec.from_dict(self.row["launch"])
        self.job_dir = store.job_dir(name)
        self.log_dir = self.job_dir / "logs"
        self.metrics_file = self.job_dir / "metrics.jsonl"
        self.metrics_offset = self.metrics_file.stat().st_size if self.metrics_file.exists() else 0
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.terminating = False

    # lifecycle

    def run(self) -> None:
        python = sys.executable
        if self.spec.packages:
            try:
                python = prepare_environment(self.job_dir / "venv", self.spec.packages, self.spec.pip_index_urls)
            except PackageInstallError as exc:
                self._finish("Failed", "PackageInstallFailed", str(exc))
                return
            self.store.add_event(self.name, "PackagesInstalled", f"installed {' '.join(self.spec.packages)}")
        started = time.time()
        restarts = self.row["restarts"]
        while not self.terminating:
            self._start_nodes(python, restarts)
            if restarts == self.row["restarts"]:
                self.store.transition(self.name, "Running", "NodesStarted", f"{len(self.nodes)} node(s) running",
                                      from_statuses=("Created",), started=started)
            outcome = self._watch(started)
            if outcome is None:  # terminating, suspended or finished: status already written
                return
            if self.spec.elastic and restarts < self.spec.max_restarts:
                restarts += 1
                self.store.update_job(self.name, restarts=restarts)
                self.store.add_event(self.name, "Restarting", f"restart {restarts} of {self.spec.max_restarts}: {outcome}",
                                     type="Warning")
                continue
            self._finish("Failed", "NodeFailed", outcome)
            return

    def _start_nodes(self, python: str, restarts: int) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port = launcher.free_port()
        self.nodes = []
        for node in self.spec.nodes:
            env = launcher.node_environment(node, port, python, restarts=restarts, elastic=self.spec.elastic)
            log = launcher_log(self.log_dir, node.index)
            process = subprocess.Popen(
                launcher.node_argv(node.command, python),
                cwd=self.spec.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=(lambda cpus=node.cpus: launcher.restrict_cpus(cpus)) if node.cpus else None,
            )
            log.close()
            self.nodes.append(process)
            self.store.set_node(self.name, node.index, pid=process.pid, pid_started=processes.start_time(process.pid),
                                status="Running", exit_code=None, started=time.time(), finished=None)
        self.store.add_event(self.name, "NodesStarted", f"started {len(self.nodes)} node process(es), rendezvous at 127.0.0.1:{port}")

    def _watch(self, started: float) -> str | None:
        """Wait for the nodes; a failure description when one failed, else ``None`` once the job is settled."""
        deadline = started + self.spec.active_deadline_seconds if self.spec.active_deadline_seconds else None
        recorded: set[int] = set()
        while True:
            self._ingest_metrics()
            if self.terminating:
                self._stop_nodes()
                return None
            codes = [node.poll() for node in self.nodes]
            for index, code in enumerate(codes):
                if code is not None and index not in recorded:
                    self._record_exit(index, code)
                    recorded.add(index)
            failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                return self._settle_failure(failed)
            if all(code == 0 for code in codes):
                self._ingest_metrics()
                self._finish("Complete", "Completed", f"all {len(codes)} node(s) exited with code 0")
                return None
            if deadline is not None and time.time() > deadline:
                self._stop_nodes()
                self._finish("Failed", "DeadlineExceeded",
                             f"ran longer than activeDeadlineSeconds={self.spec.active_deadline_seconds}")
                return None
            if self._suspend_requested():
                self._stop_nodes()
                self.store.transition(self.name, "Suspended", "Suspended", "node processes stopped; resume to start them again",
                                      from_statuses=("Created", "Running"), request=None)
                self.store.add_event(self.name, "Suspended", "node processes stopped")
                return None
            time.sleep(POLL_SECONDS)

    def _settle_failure(self, failed: list[int]) -> str:
        until = time.monotonic() + FAILURE_SETTLE_SECONDS
        while time.monotonic() < until and any(node.poll() is None for node in self.nodes):
            time.sleep(POLL_SECONDS)
        codes = [node.poll() for node in self.nodes]
        failed = failed + [i for i, code in enumerate(codes) if code not in (None, 0) and i not in failed]
        for index in failed:
            self._record_exit(index, codes[index])
        self._stop_nodes()
        failures = [logs.diagnose_node_failure(self.job_dir, i, codes[i]) for i in failed]
        return logs.pick_root_cause(failures).describe()

    def _record_exit(self, index: int, code: int) -> None:
        self.store.set_node(self.name, index, status="Succeeded" if code == 0 else "Failed", exit_code=code,
                            finished=time.time())

    def _stop_nodes(self) -> None:
        running = [node for node in self.nodes if node.poll() is None]
        for node in running:
            processes.signal_group(node.pid, signal.SIGTERM)
        # torchrun starts training processes in sessions of their own: sweep for anything left of this job.
        processes.stop_processes(processes.job_processes(str(self.job_dir), self.row["created"]), grace=NODE_STOP_GRACE_SECONDS)
        for node in self.nodes:
            node.wait()
        for index, node in enumerate(self.nodes):
            if node in running:
                self.store.set_node(self.name, index, status="Stopped", exit_code=node.returncode, finished=time.time())

    def _finish(self, status: str, reason: str, message: str) -> None:
        if self.store.transition(self.name, status, reason, message, from_statuses=("Created", "Running"),
                                 finished=time.time(), request=None):
            self.store.add_event(self.name, reason, message, type="Normal" if status == "Complete" else "Warning")

    def _suspend_requested(self) -> bool:
        request = self.store.get_request(self.name)
        if request == "deleted":
            self.terminating = True
        return request == "suspend"

    def _ingest_metrics(self) -> None:
        try:
            with self.metrics_file.open("rb") as f:
                f.seek(self.metrics_offset)
                data = f.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        if not complete:
            return
        self.metrics_offset += len(complete)
        records = []
        for raw in complete.splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("time"), int | float):
                records.append(record)
        self.store.add_metrics(self.name, records)


def launcher_log(log_dir: Path, index: int) -> IO[bytes]:
    return (log_dir / f"node-{index}.log").open("ab")


def main(argv: list[str] | None = None) -> int:
    home, name = argv if argv is not None else sys.argv[1:]
    store = Store.open(home)
    supervisor = Supervisor(store, name)

    def terminate(signum: int, frame: object) -> None:
        supervisor.terminating = True

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        supervisor.run()
    except Exception as exc:  # the job must not stay Running when the supervisor itself breaks
        supervisor._stop_nodes()
        supervisor._finish("Failed", "SupervisorError", f"{type(exc).__name__}: {exc}")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
