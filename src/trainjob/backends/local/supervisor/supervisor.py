"""The detached process that owns one job: ``python -m trainjob.backends.local.supervisor HOME NAME``.

It installs the job's ``packages_to_install`` first, into the environment cached for them
(:mod:`~trainjob.backends.local.supervisor.environment`; a later job with the same packages reuses it), pip's output
going into node-0's log and its latest line into the job's message. It starts one keeper per node
(:mod:`~trainjob.backends.local.node_keeper`, which starts and contains the node process), watches them, ingests the
metrics rank 0 writes, enforces ``activeDeadlineSeconds``, honours suspend and delete requests, restarts the node
group of an elastic job up to ``maxRestarts`` and writes every transition to the store. A shrinkable elastic job
(:attr:`~trainjob.backends.local.process_specs.ProcessSpec.shrinkable`) is not restarted when a node is *lost*
(killed, not failed by its own ranks) while ``minNodes`` remain: the others go on at the smaller size
(``NodeLost``), the node is started again after the job's back-off (``GrowRequested``, ``NodeReturned``), and every
change of size the ranks report becomes a ``Resized`` event ("Resized 3 -> 2 nodes (node-1 was lost)") and the job's
message (:mod:`~trainjob.backends.local.supervisor.rendezvous`). A job that stops making progress (its reports, or
for a job that does not report, its collectives) is caught by the stall watch
(:mod:`~trainjob.backends.local.supervisor.stall_watch`): a ``Stalled`` event names the rank the others wait for and its
frame, then the job fails, its node group restarts, or (a job that does not report, by default) the warning is
repeated while the stall lasts. A job's status only moves ``Created ->
Running -> Complete | Failed`` (or ``Suspended``).

A supervisor holds the job's supervisor lock (:func:`~trainjob.backends.local.processes.hold_supervisor_lock`)
for its whole life. When it is killed, a replacement (``... HOME NAME --replace``, started by a node's keeper at
once, or by the next reader of the job) takes the lock and carries on from the store: it adopts the keepers that
still run, collects the results of nodes that ended meanwhile, ingests metrics from the saved offset, and then
does what the lost supervisor would have done (an elastic job still restarts its node group from its
checkpoint when a node fails). Training is not interrupted. A replacement that finds the job over or deleted
exits with :data:`~trainjob.backends.local.node_keeper.keeper.JOB_OVER_EXIT_CODE`, and the keepers stop their nodes.
Whatever way it exits, it admits the queued jobs that fit what its job freed
(:func:`~trainjob.backends.local.supervisor.start.admit`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from typing import Any

import psutil

from trainjob.backends.local import containers, process_specs, processes
from trainjob.backends.local.log_writer import NodeLogWriter, note_stop_reason
from trainjob.backends.local.node_keeper.keeper import (
    JOB_OVER_EXIT_CODE,
    KEEPER_STOP_SECONDS,
    STOP_GRACE_SECONDS,
)
from trainjob.backends.local.node_keeper.mounts import node_mounts
from trainjob.backends.local.process_specs import ProcessSpec
from trainjob.backends.local.store import ACTIVE_STATUSES, Store
from trainjob.backends.local.supervisor import initializers, rendezvous, warm
from trainjob.backends.local.supervisor.environment import (
    InstallStopped,
    PackageInstallError,
    environment_dir,
    prepare_environment,
)
from trainjob.backends.local.supervisor.failures import node_failures, pick_root_cause
from trainjob.backends.local.supervisor.nodes import NodeHandle
from trainjob.backends.local.supervisor.stall_watch import Stall, StallEnded, StallWatch
from trainjob.backends.local.supervisor.warm_keepers import release_warm_keepers
from trainjob.backends.local.volumes import read_host_volumes
from trainjob.constants import COMPLETE, CREATED, FAILED, QUEUED, RUNNING, SUSPENDED
from trainjob.errors import NotFoundError, is_disk_full
from trainjob.ports import free_port
from trainjob.runnable import RunnableClock

#: How often the supervisor looks at what nodes do not wake it for (metrics, requests, the stall watch); a
#: keeper that exits wakes it at once (its pidfd).
POLL_SECONDS = 0.1
#: How often it looks while nodes are being stopped or a failure settles.
STOPPING_POLL_SECONDS = 0.05
#: How long a store write that met a full disk waits before it is tried again.
DISK_FULL_RETRY_SECONDS = 1.0
#: After the first node fails, how long to wait for the others' own reports before choosing the root cause.
FAILURE_SETTLE_SECONDS = 1.5
#: How long a returning node waits for the ranks to checkpoint for it before it is started anyway.
GROW_WAIT_SECONDS = 600.0


class Supervisor:
    """Runs one job to its end: ``Supervisor(Store.open(home), "mnist").run()``."""

    def __init__(self, store: Store, name: str, replacing: bool = False) -> None:
        self.store = store
        #: Whether the supervisor's log already says the store's disk is full.
        self.disk_full_noted = False
        self.name = name
        self.replacing = replacing
        self.job_dir = store.job_dir(name)
        self.metrics_file = self.job_dir / "metrics.jsonl"
        self.metrics_offset = 0
        self.row: dict = {}
        self.nodes: list[NodeHandle] = []
        self.recorded: set[int] = set()
        self.terminating = False
        # Shrinkable jobs (process_specs.ProcessSpec.shrinkable): lost nodes and when each comes back, nodes started
        # again, why the size changes next, the rendezvous store, and the rounds rank 0 reports.
        self.lost: dict[int, float] = {}
        self.returned: set[int] = set()
        self.resize_reasons: list[str] = []
        self.rendezvous_port: int | None = None
        self.rendezvous_store: object | None = None
        self.grow_requested: float | None = None
        self.last_round: dict = {}
        #: node-0's log of this attempt already holds the package install (the keeper continues it).
        self.continue_log = False

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
        self.spec = ProcessSpec.from_dict(self.row["launch"])
        self.stall_watch = StallWatch(self.job_dir, self.spec.stall, self._running_tree_pids)
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
        try:
            self._supervise(adopted)
        finally:
            if self.spec.shrinkable:
                self._stop_rendezvous_store()
            if self.spec.container is not None and not self.spec.container.keep:
                containers.remove_job_containers(self.spec.container.tool, self.name, str(self.job_dir))
        return 0

    def _supervise(self, adopted: bool) -> None:
        python = self._python(adopted)
        if python is None:
            return
        if self.spec.steps and not adopted and not self._run_steps(python):
            return
        started = self.row["started"] or time.time()
        restarts = self.row["restarts"]
        self.python, self.restarts, self.port = python, restarts, free_port()
        info = rendezvous.store_info(self.job_dir) if adopted and self.spec.shrinkable else None
        self.rendezvous_port = info["port"] if info else None
        while not self.terminating:
            if not adopted:
                self._start_nodes(python, restarts, started)
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
            self._finish(FAILED, "NodeFailed", outcome)
            return

    def _python(self, adopted: bool) -> str | None:
        """The job's interpreter: with packages to install, that of their cached environment, installed first if
        no job did before (not when adopting running nodes). What pip prints goes into node-0's log, and its
        latest line into the job's message while it runs."""
        if not self.spec.packages:
            return sys.executable
        packages = " ".join(self.spec.packages)
        venv = environment_dir(self.store.home, self.spec.packages, self.spec.pip_index_urls)
        if adopted and (venv / "bin" / "python").exists():
            return str(venv / "bin" / "python")
        log = NodeLogWriter(self.job_dir, 0, self.spec.log_max_bytes)  # node-0's keeper goes on in the same log

        def on_line(line: str) -> None:
            log.write(f"{line}\n".encode(errors="replace"))
            if line.strip():  # the job's message while it is Created: `trainjob get` shows how far pip is
                self.store.transition(self.name, CREATED, "InstallingPackages",
                                      f"installing {packages}: {line.strip()[:300]}", from_statuses=(CREATED,))

        try:
            on_line(f"[trainjob] packages_to_install: {packages} (environment {venv})")
            prepared = prepare_environment(venv, self.spec.packages, self.spec.pip_index_urls, on_line=on_line,
                                           should_stop=self._suspend_requested_or_terminating)
            if prepared.installed:
                on_line(f"[trainjob] installed in {prepared.seconds:.1f} s; later jobs with the same packages reuse it")
            else:
                on_line("[trainjob] already installed by an earlier job: reusing it")
        except InstallStopped:  # deleted (the job goes with its row) or suspended
            if not self.terminating:
                self.store.transition(self.name, SUSPENDED, "Suspended", "suspended while installing packages; "
                                      "resume to start again", from_statuses=ACTIVE_STATUSES, request=None)
                self.store.add_event(self.name, "Suspended", "stopped installing packages")
            return None
        except PackageInstallError as exc:
            on_line(f"[trainjob] {exc}")
            self._finish(FAILED, "PackageInstallFailed", str(exc))
            return None
        finally:
            log.close()
        self.continue_log = True
        if prepared.installed:
            self.store.add_event(self.name, "PackagesInstalled", f"installed {packages} in {prepared.seconds:.1f} s "
                                 f"into the environment cached at {venv}; later jobs with the same packages reuse it")
        else:
            self.store.add_event(self.name, "PackagesReused", f"{packages}: reusing the environment cached at {venv} "
                                 "(installed by an earlier job)")
        return prepared.python

    def _run_steps(self, python: str) -> bool:
        """Run the steps the trainer waits for (:mod:`~trainjob.backends.local.supervisor.initializers`), their
        output into node-0's log; whether the nodes may start (else the job failed or was suspended)."""
        log = NodeLogWriter(self.job_dir, 0, self.spec.log_max_bytes, new_attempt=not self.continue_log)
        self.store.add_event(self.name, "StepsStarted", "running " + ", ".join(s.name for s in self.spec.steps)
                             + " before the nodes")

        def on_progress(step: str, line: str) -> None:
            self.store.transition(self.name, CREATED, "Initializing", f"{step}: {line}"[:500],
                                  from_statuses=(CREATED,))

        started = time.monotonic()
        try:
            failure = initializers.run_steps(
                self.spec.steps, self.job_dir, python, self.spec.base_env or process_specs.passed_env(os.environ),
                self.spec.cwd, lambda line: log.write(f"{line}\n".encode(errors="replace")), on_progress,
                self._suspend_requested_or_terminating)
        except initializers.StepsStopped:
            if not self.terminating:
                self.store.transition(self.name, SUSPENDED, "Suspended", "suspended while its initializers ran; "
                                      "resume to start again", from_statuses=ACTIVE_STATUSES, request=None)
                self.store.add_event(self.name, "Suspended", "stopped the initializers")
            return False
        finally:
            log.close()
        self.continue_log = True
        if failure is not None:
            self._finish(FAILED, "InitializerFailed", f"{failure.step} failed: {failure.message}")
            return False
        self.store.add_event(self.name, "StepsCompleted", f"{', '.join(s.name for s in self.spec.steps)} done in "
                             f"{time.monotonic() - started:.1f} s")
        return True

    def _suspend_requested_or_terminating(self) -> bool:
        return self._suspend_requested() or self.terminating

    def _start_nodes(self, python: str, restarts: int, job_started: float) -> None:
        """Start every node's keeper; the job becomes Running (from Created) in the same store write that records
        the nodes (``job_started`` is its start time)."""
        (self.job_dir / "logs").mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.nodes, self.recorded = [], set()
        self.lost, self.returned, self.grow_requested = {}, set(), None
        self.resize_reasons = ["the node group was restarted"] if restarts else []
        self.stall_watch.reset()
        if self.spec.shrinkable:
            rendezvous.clear_grow(self.job_dir)
            self.rendezvous_port = free_port()
            self.rendezvous_store = rendezvous.start_store(self.job_dir, self.rendezvous_port, python,
                                                          self.spec.base_env or process_specs.passed_env(os.environ))
        self.python, self.port, self.restarts = python, port, restarts
        if self.spec.container is not None:
            containers.create_network(self.spec.container.tool, self.name, str(self.job_dir))
        started = []
        for node in self.spec.nodes:
            handle = self._start_node(node.index)
            if self.spec.elastic:
                # c10d rendezvous ranks nodes by their torchrun's pid: started in order, node i gets group rank i.
                handle.wait_started(timeout=5)
            self.nodes.append(handle)
            started.append(time.time())
        release_warm_keepers(wait=False)  # those no node took: the job has all it needs
        where = self.rendezvous_port if self.spec.shrinkable else port
        with self.store.transaction():  # the nodes, the event and the job's status: one write
            for handle, when in zip(self.nodes, started, strict=True):
                self.store.set_node(self.name, handle.index, pid=handle.pid, pid_started=handle.started,
                                    status="Running", exit_code=None, started=when, finished=None)
            if self.spec.container is not None:
                started_what = f"started {len(self.nodes)} node container(s) on network " \
                    f"{containers.network_name(self.name, str(self.job_dir))}, rendezvous at " \
                    f"{containers.node_host(self.name, 0)}:{port}"
            else:
                started_what = f"started {len(self.nodes)} node process(es), rendezvous at 127.0.0.1:{where}"
            self.store.add_event(self.name, "NodesStarted", started_what)
            self.store.transition(self.name, RUNNING, "NodesStarted", f"{len(self.nodes)} node(s) running",
                                  from_statuses=(CREATED,), started=job_started)

    def _start_node(self, index: int) -> NodeHandle:
        """Start the keeper of node ``index`` (after :meth:`_start_nodes` set the group's ports)."""
        node = self.spec.nodes[index]
        if self.spec.container is not None:
            keeper_spec = self._container_keeper_spec(node)
            if node.index == 0:
                self.continue_log = False
            return NodeHandle.start(self.job_dir, node.index, keeper_spec)
        env = process_specs.node_environment(node, self.port, self.python, restarts=self.restarts, elastic=self.spec.elastic,
                                        base_env=self.spec.base_env or None,
                                        rendezvous_port=self.rendezvous_port if self.spec.shrinkable else None,
                                        max_restarts=self.spec.max_restarts)
        keeper_spec = {
            "home": str(self.store.home), "name": self.name, "job_dir": str(self.job_dir), "node": node.index,
            "argv": process_specs.node_argv(node.command, self.python, shrinkable=self.spec.shrinkable), "env": env,
            "cwd": self.spec.cwd, "cpus": node.cpus, "log_max_bytes": self.spec.log_max_bytes,
            "mounts": node_mounts(self.job_dir, node.index),  # read here, so the keeper starts its node sooner
            # node-0's log of this attempt starts with the package install: the keeper appends to it
            "continue_log": self.continue_log and node.index == 0,
            # c10d rendezvous ranks an elastic job's nodes by their torchrun's pid (see _start_nodes): a warm
            # torchrun has the pid it got at its start, so those nodes start when their turn comes instead
            "use_warm_node": not self.spec.elastic,
        }
        if node.index == 0:
            self.continue_log = False
        return NodeHandle.start(self.job_dir, node.index, keeper_spec)

    def _container_keeper_spec(self, node: process_specs.NodeProcessSpec) -> dict[str, Any]:
        """The keeper spec of a node that runs as a container: the keeper runs the engine's ``run``, attached."""
        container = self.spec.container
        assert container is not None
        env = process_specs.container_node_environment(node, self.port, self.restarts, self.spec.elastic)
        host_volumes = read_host_volumes(self.job_dir)
        mounts = [(m.mount_path, m.host_path(node.index), m.read_only, m.tmpfs_bytes)
                  for m in (host_volumes.mounts if host_volumes is not None else [])]
        argv, engine_env = containers.node_command(container, self.name, str(self.job_dir), node.index, node.command,
                                                   env, mounts, node.cpus, node.gpus)
        return {
            "home": str(self.store.home), "name": self.name, "job_dir": str(self.job_dir), "node": node.index,
            "argv": argv, "env": engine_env, "cwd": str(self.job_dir), "cpus": [],
            "log_max_bytes": self.spec.log_max_bytes, "mounts": None, "use_warm_node": False,
            "continue_log": self.continue_log and node.index == 0,
            "container": {"engine": container.engine, "engine_path": container.engine_path, "keep": container.keep,
                          "name": containers.container_name(self.name, str(self.job_dir), node.index),
                          "memory_bytes": container.memory_bytes},
        }

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
            failed = [i for i, code in enumerate(codes) if code not in (None, 0) and i not in self.lost]
            below_min = None
            if failed and self.spec.shrinkable:
                failed, below_min = self._lose_nodes(failed, codes)
            if failed:
                outcome = self._settle_failure(failed)
                return f"{below_min}; {outcome}" if below_min else outcome
            if self.spec.shrinkable:
                self._follow_rounds()
                codes = self._bring_back(codes)
            if (stall := self.stall_watch.check(time.time())) is not None:
                if isinstance(stall, StallEnded):
                    self._stall_ended(stall)
                elif stall.action == "warn":
                    self._warn_of_stall(stall)
                else:
                    return self._stalled(stall)
            kept = [code for i, code in enumerate(codes) if i not in self.lost]
            if kept and all(code == 0 for code in kept):
                self._ingest_metrics()
                lost = "".join(f"; node-{i} was lost" for i in sorted(self.lost))
                self._finish(COMPLETE, "Completed", f"all {len(kept)} node(s) exited with code 0{lost}")
                return None
            if deadline is not None and time.time() > deadline:
                self._stop_nodes(f"activeDeadlineSeconds={self.spec.active_deadline_seconds} exceeded")
                self._finish(FAILED, "DeadlineExceeded",
                             f"ran longer than activeDeadlineSeconds={self.spec.active_deadline_seconds}")
                return None
            if self._suspend_requested():
                self._stop_nodes("the job was suspended; `trainjob resume` starts it again")
                self.store.transition(self.name, SUSPENDED, "Suspended", "node processes stopped; resume to start them again",
                                      from_statuses=ACTIVE_STATUSES, request=None)
                self.store.add_event(self.name, "Suspended", "node processes stopped")
                return None
            self._wait_for_nodes(POLL_SECONDS)

    def _wait_for_nodes(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking at once when a running node's keeper exits (its pidfd)."""
        poller = select.poll()
        for node in self.nodes:
            fd = node.pidfd()
            if fd is not None:
                poller.register(fd, select.POLLIN)
        poller.poll(timeout * 1000)

    # shrink and grow (shrinkable jobs)

    def _lose_nodes(self, failed: list[int], codes: list[int | None]) -> tuple[list[int], str | None]:
        """Let the others go on without the failed nodes that were lost (killed, not failed on their own).

        Returns the failures left for the usual path (the whole node group restarts or fails) and, when the
        loss left fewer than ``minNodes``, a sentence saying so."""
        if any(code == 0 for code in codes):
            return failed, None  # training is over: nothing to go on with
        lost = [i for i in failed if self._was_lost(i, codes[i])]
        if not lost:
            return failed, None
        alive = sum(code is None for code in codes)
        names = ", ".join(f"node-{i}" for i in lost)
        if alive < (self.spec.min_nodes or 1):
            return failed, f"{names} lost, {alive} node(s) left: below minNodes={self.spec.min_nodes}"
        now = time.time()
        for index in lost:
            why = self._loss_description(index, codes[index])
            # Swept first: once the loss is recorded, the others' agents drop the node's agent from the rendezvous
            # as soon as its process is gone, instead of waiting for its heartbeat to lapse.
            self._sweep_node(index)
            rendezvous.record_loss(self.job_dir, index, why, remaining=alive)
            self.lost[index] = now + self.spec.node_backoff_seconds
            self.stall_watch.reset()  # the others pause to go on without it
            self.returned.discard(index)
            self.resize_reasons.append(f"node-{index} was lost")
            self.store.add_event(
                self.name, "NodeLost",
                f"node-{index} was lost ({why}); {alive} node(s) go on from their last checkpoint "
                f"(minNodes {self.spec.min_nodes}); node-{index} is started again in "
                f"{self.spec.node_backoff_seconds:g} s",
                type="Warning",
            )
        self.store.update_job(self.name, message=f"{alive} of {len(self.nodes)} node(s) running; {names} lost")
        return [i for i in failed if i not in lost], None

    def _was_lost(self, index: int, code: int | None) -> bool:
        """Whether node ``index`` was lost (its keeper or its torchrun killed) rather than failed by its ranks."""
        node = self.nodes[index]
        if node.exit is not None and node.exit.lost:
            return True
        return code is not None and code < 0 and code != -signal.SIGTERM

    @staticmethod
    def _loss_description(index: int, code: int | None) -> str:
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"

    def _sweep_node(self, index: int) -> None:
        """Stop what is left of a lost node (its keeper may have been killed without its processes)."""
        leftovers = []
        for process in processes.job_processes(str(self.job_dir), self.row.get("created", 0.0)):
            with contextlib.suppress(psutil.Error):
                if process.environ().get("PET_NODE_RANK") == str(index):
                    leftovers.append(process)
        if leftovers:
            processes.stop_processes(leftovers, grace=0.5)

    def _bring_back(self, codes: list[int | None]) -> list[int | None]:
        """Start lost nodes whose back-off is over; with a training script that checkpoints for grows
        (``trainjob.torch.ElasticConfig``), only once the ranks saved a checkpoint and wait for them."""
        if not self.lost:
            return codes
        if any(code == 0 for code in codes):
            return self._drop_late_nodes(codes)  # training is over: a node started now would wait in vain
        now = time.time()
        due = sorted(i for i, when in self.lost.items() if when <= now)
        if not due:
            return codes
        if self.last_round.get("gated"):
            if self.grow_requested is None:
                rendezvous.request_grow(self.job_dir, due)
                self.grow_requested = now
                self.store.add_event(self.name, "GrowRequested",
                                     f"{', '.join(f'node-{i}' for i in due)} can come back; waiting for the ranks "
                                     "to reach their next checkpoint")
                return codes
            if rendezvous.grow_ready(self.job_dir) is None and now - self.grow_requested < GROW_WAIT_SECONDS:
                return codes
        codes = list(codes)
        for index in due:
            del self.lost[index]
            self.recorded.discard(index)
            handle = self._start_node(index)
            self.nodes[index] = handle
            codes[index] = None
            self.returned.add(index)
            self.stall_watch.reset()
            self.resize_reasons.append(f"node-{index} came back")
            self.store.set_node(self.name, index, pid=handle.pid, pid_started=handle.started, status="Running",
                                exit_code=None, started=time.time(), finished=None)
            self.store.add_event(self.name, "NodeReturned",
                                 f"node-{index} started again after {self.spec.node_backoff_seconds:g} s; "
                                 "it joins the others at their next rendezvous")
        return codes

    def _stop_rendezvous_store(self) -> None:
        info = rendezvous.store_info(self.job_dir)
        if not info:
            return
        with contextlib.suppress(psutil.Error, KeyError, TypeError):
            process = psutil.Process(info["pid"])
            if process.environ().get(processes.JOB_DIR_ENV) == str(self.job_dir):
                process.terminate()
                with contextlib.suppress(psutil.TimeoutExpired):
                    process.wait(3)
                    return
                process.kill()
                process.wait(3)

    def _drop_late_nodes(self, codes: list[int | None]) -> list[int | None]:
        """Stop nodes that came back but never joined a round before training ended; they will not be needed."""
        joined = self.last_round.get("node_ranks") or []
        codes = list(codes)
        for index in sorted(self.returned):
            if codes[index] is None and index not in joined:
                self.nodes[index].terminate()
                codes[index] = self.nodes[index].wait(KEEPER_STOP_SECONDS)
                self.returned.discard(index)
                self.lost[index] = float("inf")
                self.recorded.add(index)
                self.store.set_node(self.name, index, status="Stopped", exit_code=codes[index], finished=time.time())
                self.store.add_event(self.name, "NodeNotNeeded",
                                     f"node-{index} came back after training ended; stopped it")
        return codes

    def _follow_rounds(self) -> None:
        """Turn the rounds rank 0 reports (``elastic.jsonl``) into ``Resized`` events and the job's message."""
        records, offset = rendezvous.read_lines(rendezvous.rounds_path(self.job_dir), self.row.get("elastic_offset") or 0)
        if not records:
            return
        self.row["elastic_offset"] = offset
        for record in records:
            nodes = record.get("nodes")
            if not isinstance(nodes, int):
                continue
            before = self.row.get("elastic_nodes")
            self.last_round = record
            self.row["elastic_nodes"] = nodes
            if before is None or nodes == before:
                continue
            why = "; ".join(self.resize_reasons) or "the rendezvous changed"
            self.resize_reasons = []
            self.stall_watch.reset()
            message = f"Resized {before} -> {nodes} nodes ({why})"
            self.store.add_event(self.name, "Resized", message, type="Normal" if nodes > before else "Warning")
            self.store.update_job(
                self.name, message=f"{nodes} of {len(self.nodes)} node(s) running (world size "
                f"{record.get('world_size')}, step {record.get('step')}); resized {before} -> {nodes}: {why}",
            )
            if nodes > before:
                self.grow_requested = None
                rendezvous.clear_grow(self.job_dir)
        self.store.update_job(self.name, elastic_offset=offset, elastic_nodes=self.row["elastic_nodes"])

    def _stalled(self, stall: Stall) -> str | None:
        """Record a stall (event and message), stop the nodes, then fail the job (``None``) or return the outcome
        that restarts the node group (``trainjob/stall-action: restart`` with restarts left)."""
        restart = stall.action == "restart" and self.restarts < self.spec.max_restarts
        then = (f"restarting the node group from its checkpoint (restart {self.restarts + 1} of "
                f"{self.spec.max_restarts})" if restart else "failing the job")
        self.store.update_job(self.name, message=f"stalled, {then}: {stall.message}")
        self._stop_nodes(f"the job stalled ({stall.stuck.summary}); {then}")
        if restart:
            self.store.add_event(self.name, "Stalled", stall.message, type="Warning")
            return f"stalled: {stall.message}"
        spent = f"; no restarts left (maxRestarts {self.spec.max_restarts})" if stall.action == "restart" else ""
        self._finish(FAILED, "Stalled", stall.message + spent)  # its event is the Stalled event
        return None

    def _warn_of_stall(self, stall: Stall) -> None:
        """A stall of a job that does not report, with no ``trainjob/stall-action``: said, and the job runs on."""
        with self.store.transaction():
            self.store.add_event(self.name, "Stalled", stall.message, type="Warning")
            self.store.update_job(self.name, message=f"stalled: {stall.message}")

    def _stall_ended(self, ended: StallEnded) -> None:
        with self.store.transaction():
            self.store.add_event(self.name, "StallEnded", ended.message)
            self.store.update_job(self.name, message=f"{len(self.nodes)} node(s) running; {ended.message}")

    def _running_tree_pids(self) -> list[int]:
        """The running nodes' keepers and every process under them."""
        return processes.tree_pids([node.pid for node in self.nodes if node.poll() is None])

    def _settle_failure(self, failed: list[int]) -> str:
        # Counted in the time the nodes left could run: on a machine busier than its cores, a node whose rank
        # failed first may still be waiting for a CPU to write its report and exit (up to MAX_STRETCH times longer).
        clock = RunnableClock(self._running_tree_pids)
        while clock.read() < FAILURE_SETTLE_SECONDS and any(node.poll() is None for node in self.nodes):
            time.sleep(STOPPING_POLL_SECONDS)
        codes = [node.poll() for node in self.nodes]
        failed = failed + [i for i, code in enumerate(codes) if code not in (None, 0) and i not in failed]
        for index in failed:
            self._record_exit(index, codes[index])
        self._stop_nodes(f"node-{failed[0]} failed")
        failures = [f for i in failed for f in node_failures(self.job_dir, i, self.nodes[i].exit, codes[i])]
        return pick_root_cause(failures).describe()

    def _record_exit(self, index: int, code: int) -> None:
        if index not in self.recorded:
            finished = time.time()
            while True:
                try:
                    self.store.set_node(self.name, index, status="Succeeded" if code == 0 else "Failed",
                                        exit_code=code, finished=finished)
                    break
                except Exception as exc:
                    if not is_disk_full(exc):
                        raise
                    self._wait_for_space(exc)
            self.recorded.add(index)

    def _stop_nodes(self, reason: str = "stop requested") -> None:
        running = [node for node in self.nodes if node.poll() is None]
        if running:
            note_stop_reason(self.job_dir, reason)  # each keeper writes it into its node's log before stopping it
        for node in running:
            node.terminate()
        deadline = time.monotonic() + KEEPER_STOP_SECONDS
        while time.monotonic() < deadline and any(node.poll() is None for node in running):
            time.sleep(STOPPING_POLL_SECONDS)
        for node in running:
            node.kill()
        # A keeper killed before it stopped its node leaves processes behind: they all carry the job's directory.
        job_processes = processes.job_processes(str(self.job_dir), self.row.get("created", 0.0))
        processes.stop_processes(job_processes, grace=STOP_GRACE_SECONDS)  # as a keeper gives its node
        for node in running:
            node.wait(5)
            self.recorded.add(node.index)
            self.store.set_node(self.name, node.index, status="Stopped", exit_code=node.code, finished=time.time())

    def _finish(self, status: str, reason: str, message: str) -> None:
        finished = time.time()
        while True:
            try:
                with self.store.transaction():  # the status and its event: one write
                    if self.store.transition(self.name, status, reason, message, from_statuses=ACTIVE_STATUSES,
                                             finished=finished, request=None):
                        self.store.add_event(self.name, reason, message,
                                             type="Normal" if status == COMPLETE else "Warning")
                return
            except Exception as exc:  # the outcome is kept until the disk has room for it
                if not is_disk_full(exc):
                    raise
                self._wait_for_space(exc)

    def _wait_for_space(self, exc: BaseException) -> None:
        """A store write met a full disk: say so (once), then wait a moment before it is tried again. The nodes
        train on meanwhile; nothing is lost but output the disk had no room for."""
        if not self.disk_full_noted:
            self.disk_full_noted = True
            print(f"{time.strftime('%H:%M:%S')} the job store's disk is full ({exc}); its state is written once "
                  "there is room again, and training goes on meanwhile", file=sys.stderr, flush=True)
        time.sleep(DISK_FULL_RETRY_SECONDS)

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
        try:
            self.store.add_metrics(self.name, records, offset=self.metrics_offset + len(complete))
        except Exception as exc:  # no room for them now: read them again at the next look
            if not is_disk_full(exc):
                raise
            self._wait_for_space(exc)
            return
        self.stall_watch.saw(record["time"] for record in records)
        self.metrics_offset += len(complete)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    is_warm = warm.warm_keeper_count(args) is not None
    if is_warm:  # started before its job exists (its warm keepers too, by the entry point): wait to be handed one
        handed = warm.wait_for_job()
        if handed is None:
            release_warm_keepers()
            return 0
        args = list(handed)
    home, name = [arg for arg in args if arg != "--replace"]
    store = Store.open(home)
    if is_warm:
        processes.join_job(store.job_dir(name))
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
        supervisor._finish(FAILED, "SupervisorError", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        release_warm_keepers()
        admit_next(store)


def admit_next(store: Store) -> None:
    """Start the queued jobs that fit now that this job's nodes are gone (the local queue has no daemon)."""
    try:
        if not store.has_status(QUEUED):
            return  # nothing waits: the queue is not even imported
        from trainjob.backends.local.supervisor.start import admit

        admit(store)
    except Exception as exc:  # the next reader admits them; never mask the job's own outcome
        print(f"admitting queued jobs failed: {type(exc).__name__}: {exc}", file=sys.stderr)

