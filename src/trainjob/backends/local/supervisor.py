"""The detached process that owns one job: ``python -m trainjob.backends.local.supervisor HOME NAME``.

It starts one keeper per node (:mod:`~trainjob.backends.local.node_keeper`, which starts and contains the node
process), watches them, ingests the metrics rank 0 writes, enforces ``activeDeadlineSeconds``, honours suspend
and delete requests, restarts the node group of an elastic job up to ``maxRestarts`` and writes every
transition to the store. A job's status only moves ``Created -> Running -> Complete | Failed`` (or
``Suspended``).

A supervisor holds the job's supervisor lock (:func:`~trainjob.backends.local.processes.hold_supervisor_lock`)
for its whole life. When it is killed, a replacement (``... HOME NAME --replace``, started by a node's keeper at
once, or by the next reader of the job) takes the lock and carries on from the store: it adopts the keepers that
still run, collects the results of nodes that ended meanwhile, ingests metrics from the saved offset, and then
does what the lost supervisor would have done (an elastic job still restarts its node group from its
checkpoint when a node fails). Training is not interrupted. A replacement that finds the job over or deleted
exits with :data:`~trainjob.backends.local.node_keeper.JOB_OVER_EXIT_CODE`, and the keepers stop their nodes.
Whatever way it exits, it admits the queued jobs that fit what its job freed (:mod:`~trainjob.backends.local.queue`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from trainjob.backends.local import launcher, processes
from trainjob.backends.local.environment import PackageInstallError, prepare_environment
from trainjob.backends.local.failures import node_failures, pick_root_cause
from trainjob.backends.local.launcher import LaunchSpec
from trainjob.backends.local.logs import note_stop_reason
from trainjob.backends.local.node_keeper import JOB_OVER_EXIT_CODE, LEFTOVER_GRACE_SECONDS, STOP_GRACE_SECONDS
from trainjob.backends.local.nodes import NodeHandle
from trainjob.backends.local.store import ACTIVE_STATUSES, Store
from trainjob.errors import NotFoundError

POLL_SECONDS = 0.05
#: After the first node fails, how long to wait for the others' own reports before choosing the root cause.
FAILURE_SETTLE_SECONDS = 1.5
#: How long stopped keepers get to stop their nodes (they SIGKILL what is left after their own grace).
KEEPER_STOP_SECONDS = STOP_GRACE_SECONDS + LEFTOVER_GRACE_SECONDS + 2.0
NODE_STOP_GRACE_SECONDS = 3.0


class Supervisor:
    """Runs one job to its end: ``Supervisor(Store.open(home), "mnist").run()``."""

    def __init__(self, store: Store, name: str, replacing: bool = False) -> None:
        self.store = store
        self.name = name
        self.replacing = replacing
        self.job_dir = store.job_dir(name)
        self.metrics_file = self.job_dir / "metrics.jsonl"
        self.metrics_offset = 0
        self.row: dict = {}
        self.nodes: list[NodeHandle] = []
        self.recorded: set[int] = set()
        self.terminating = False

    # lifecycle

    def run(self) -> int:
        """Supervise the job; 0, or ``JOB_OVER_EXIT_CODE`` when there was nothing left to supervise."""
        try:
            if processes.hold_supervisor_lock(self.job_dir) is None:
                return 0  # another supervisor has the job
            self.row = self.store.get_job(self.name)
        except (FileNotFoundError, NotFoundError):
            return JOB_OVER_EXIT_CODE
        if self.row["status"] not in ACTIVE_STATUSES or self.row["request"] == "delete":
            return JOB_OVER_EXIT_CODE
        self.spec = LaunchSpec.from_dict(self.row["launch"])
        self.metrics_offset = self.row["metrics_offset"]
        me = os.getpid()
        self.store.update_job(self.name, supervisor_pid=me, supervisor_started=processes.start_time(me),
                              supervisor_claimed=None, supervisor_replacements=0)
        adopted = self._adopt_nodes() if self.replacing else False
        if self.replacing:
            took_over = f"supervisor pid {self.row['supervisor_pid']} was lost; pid {me} took over"
            running = sum(node.poll() is None for node in self.nodes)
            self.store.add_event(self.name, "SupervisorReplaced",
                                 took_over + (f", adopting {running} running node(s)" if adopted else ""),
                                 type="Warning")
            if not adopted:  # lost before its nodes started (installing packages, between restarts)
                processes.stop_processes(processes.job_processes(str(self.job_dir), self.row["created"]))
        self._supervise(adopted)
        return 0

    def _supervise(self, adopted: bool) -> None:
        python = self._python(adopted)
        if python is None:
            return
        started = self.row["started"] or time.time()
        restarts = self.row["restarts"]
        while not self.terminating:
            if not adopted:
                self._start_nodes(python, restarts)
                self.store.transition(self.name, "Running", "NodesStarted", f"{len(self.nodes)} node(s) running",
                                      from_statuses=("Created",), started=started)
            adopted = False
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

    def _python(self, adopted: bool) -> str | None:
        """The job's interpreter, installing its packages first (not again when adopting running nodes)."""
        if not self.spec.packages:
            return sys.executable
        installed = self.job_dir / "venv" / "bin" / "python"
        if adopted and installed.exists():
            return str(installed)
        try:
            python = prepare_environment(self.job_dir / "venv", self.spec.packages, self.spec.pip_index_urls)
        except PackageInstallError as exc:
            self._finish("Failed", "PackageInstallFailed", str(exc))
            return None
        self.store.add_event(self.name, "PackagesInstalled", f"installed {' '.join(self.spec.packages)}")
        return python

    def _start_nodes(self, python: str, restarts: int) -> None:
        (self.job_dir / "logs").mkdir(parents=True, exist_ok=True)
        port = launcher.free_port()
        self.nodes, self.recorded = [], set()
        for node in self.spec.nodes:
            env = launcher.node_environment(node, port, python, restarts=restarts, elastic=self.spec.elastic,
                                            base_env=self.spec.base_env or None)
            keeper_spec = {
                "home": str(self.store.home), "name": self.name, "job_dir": str(self.job_dir), "node": node.index,
                "argv": launcher.node_argv(node.command, python), "env": env, "cwd": self.spec.cwd,
                "cpus": node.cpus, "log_max_bytes": self.spec.log_max_bytes,
            }
            handle = NodeHandle.start(self.job_dir, node.index, keeper_spec)
            if self.spec.elastic:
                # c10d rendezvous ranks nodes by their torchrun's pid: started in order, node i gets group rank i.
                handle.wait_started(timeout=5)
            self.nodes.append(handle)
            self.store.set_node(self.name, node.index, pid=handle.pid, pid_started=handle.started,
                                status="Running", exit_code=None, started=time.time(), finished=None)
        self.store.add_event(self.name, "NodesStarted", f"started {len(self.nodes)} node process(es), rendezvous at 127.0.0.1:{port}")

    def _adopt_nodes(self) -> bool:
        """Take over the keepers a lost supervisor started; ``False`` when none of its nodes was running."""
        rows = self.store.nodes(self.name)
        if not any(row["status"] == "Running" for row in rows):
            return False
        self.nodes = [NodeHandle.adopt(self.job_dir, row) for row in rows]
        self.recorded = {node.index for node in self.nodes if node.code is not None}
        return True

    def _watch(self, started: float) -> str | None:
        """Wait for the nodes; a failure description when one failed, else ``None`` once the job is settled."""
        deadline = started + self.spec.active_deadline_seconds if self.spec.active_deadline_seconds else None
        while True:
            self._ingest_metrics()
            if self.terminating:
                self._stop_nodes("the job is being deleted")
                return None
            codes = [node.poll() for node in self.nodes]
            for index, code in enumerate(codes):
                if code is not None:
                    self._record_exit(index, code)
            failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                return self._settle_failure(failed)
            if all(code == 0 for code in codes):
                self._ingest_metrics()
                self._finish("Complete", "Completed", f"all {len(codes)} node(s) exited with code 0")
                return None
            if deadline is not None and time.time() > deadline:
                self._stop_nodes(f"activeDeadlineSeconds={self.spec.active_deadline_seconds} exceeded")
                self._finish("Failed", "DeadlineExceeded",
                             f"ran longer than activeDeadlineSeconds={self.spec.active_deadline_seconds}")
                return None
            if self._suspend_requested():
                self._stop_nodes("the job was suspended; `trainjob resume` starts it again")
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
        self._stop_nodes(f"node-{failed[0]} failed")
        failures = [f for i in failed for f in node_failures(self.job_dir, i, self.nodes[i].exit, codes[i])]
        return pick_root_cause(failures).describe()

    def _record_exit(self, index: int, code: int) -> None:
        if index not in self.recorded:
            self.recorded.add(index)
            self.store.set_node(self.name, index, status="Succeeded" if code == 0 else "Failed", exit_code=code,
                                finished=time.time())

    def _stop_nodes(self, reason: str = "stop requested") -> None:
        running = [node for node in self.nodes if node.poll() is None]
        if running:
            note_stop_reason(self.job_dir, reason)  # each keeper writes it into its node's log before stopping it
        for node in running:
            node.terminate()
        deadline = time.monotonic() + KEEPER_STOP_SECONDS
        while time.monotonic() < deadline and any(node.poll() is None for node in running):
            time.sleep(POLL_SECONDS)
        for node in running:
            node.kill()
        # A keeper killed before it stopped its node leaves processes behind: they all carry the job's directory.
        job_processes = processes.job_processes(str(self.job_dir), self.row.get("created", 0.0))
        processes.stop_processes(job_processes, grace=NODE_STOP_GRACE_SECONDS)
        for node in running:
            node.wait(5)
            self.recorded.add(node.index)
            self.store.set_node(self.name, node.index, status="Stopped", exit_code=node.code, finished=time.time())

    def _finish(self, status: str, reason: str, message: str) -> None:
        if self.store.transition(self.name, status, reason, message, from_statuses=("Created", "Running"),
                                 finished=time.time(), request=None):
            self.store.add_event(self.name, reason, message, type="Normal" if status == "Complete" else "Warning")

    def _suspend_requested(self) -> bool:
        request = self.store.get_request(self.name)
        if request in ("deleted", "delete"):
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
        records = []
        for raw in complete.splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("time"), int | float):
                records.append(record)
        self.store.add_metrics(self.name, records, offset=self.metrics_offset + len(complete))
        self.metrics_offset += len(complete)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    home, name = [arg for arg in args if arg != "--replace"]
    store = Store.open(home)
    supervisor = Supervisor(store, name, replacing="--replace" in args)

    def terminate(signum: int, frame: object) -> None:
        supervisor.terminating = True

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        return supervisor.run()
    except Exception as exc:  # the job must not stay Running when the supervisor itself breaks
        supervisor._stop_nodes()
        supervisor._finish("Failed", "SupervisorError", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        admit_next(store)


def admit_next(store: Store) -> None:
    """Start the queued jobs that fit now that this job's nodes are gone (the local queue has no daemon)."""
    from trainjob.backends.local.backend import LocalBackend, LocalProcessBackendConfig

    try:
        LocalBackend(LocalProcessBackendConfig(home=store.home)).admit_queued()
    except Exception as exc:  # the next reader admits them; never mask the job's own outcome
        print(f"admitting queued jobs failed: {type(exc).__name__}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
