r"""The keeper of one node: ``python -m trainjob.backends.local.node_keeper``, its spec as JSON on stdin.

The supervisor starts one keeper per node; the keeper starts the node's command (torchrun) and stays its parent
until the node and everything it started have ended. It makes a node safe to be without a supervisor for a
moment, and never for long:

- **Output, capped.** The node's stdout and stderr come through a pipe into ``logs/node-<i>.log``, rotated at
  the job's cap (:class:`~trainjob.backends.local.log_writer.NodeLogWriter`); the per-rank files through which
  torchrun tees each rank are released as torchrun reads them
  (:class:`~trainjob.backends.local.log_writer.TorchrunCopies`), so output is stored once, not twice.
- **Nothing left behind.** The keeper is a child subreaper (``PR_SET_CHILD_SUBREAPER``): whatever the node leaves
  in the background (double-forked, in a session of its own, with a cleared environment) is re-parented to the
  keeper, which kills it when the node ends or is stopped.
- **When each rank ended.** It holds a pidfd on every training process (the node's children that have ``RANK``
  in their environment) and notes the moment each ends, so the supervisor can tell the rank that failed first
  from those that failed because of it (:mod:`trainjob.backends.local.supervisor.failures`).
- **How the node ended.** ``logs/node-<i>.exit.json`` (exit code, time, rank ends) is written before the keeper
  exits, so a supervisor that adopted the keeper, and so cannot wait for it, still learns the result.
- **Its volumes.** When the job mounts volumes in mount namespaces (:mod:`~trainjob.backends.local.volumes`), the
  node's process enters a private one with the volumes mounted before it runs the command
  (:mod:`~trainjob.backends.local.node_keeper.mounts`); the keeper itself stays in the host's.
- **Never unsupervised.** When no process holds the job's supervisor lock, the keeper starts a replacement
  supervisor (``supervisor NAME --replace``) that adopts the running nodes; keepers of later nodes wait a little
  longer first, and only one replacement wins the lock. When the replacement says the job is over (exit code
  :data:`JOB_OVER_EXIT_CODE`), or nothing has supervised the job for :data:`NODE_UNSUPERVISED_LIMIT_SECONDS`, the
  keeper stops its node.

- **Its node's process, warm.** A warm keeper (``--warm``, started by a warm supervisor before its job exists)
  starts a :class:`WarmNode` at once (:mod:`~trainjob.backends.local.node_keeper.warm_torchrun`): the node's
  torchrun with its imports under way, which becomes the node's process when the node comes (or ``exec``\ s the
  node's command when it cannot run it as it would have run).

SIGTERM stops the node: its process group gets SIGTERM and, after :data:`STOP_GRACE_SECONDS`, everything below
the keeper gets SIGKILL. The keeper exits with the node's exit code (128 + N for signal N).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainjob.backends.local.log_writer import NodeLogWriter, TorchrunCopies
from trainjob.backends.local.node_keeper.warm_node import WarmNode
from trainjob.backends.local.processes import join_job, signal_group, stop_processes, supervisor_lock_held

# Nothing here imports psutil or the volumes module before the node is started: a keeper starts torchrun as
# soon as it can, and imports what it needs later only when it needs it (leftovers to stop, volumes to mount).

POLL_SECONDS = 0.1
RELEASE_SECONDS = 0.5
SUPERVISION_CHECK_SECONDS = 0.2
#: Keeper ``i`` waits ``i`` times this before starting a replacement, so node 0's usually is the only one.
REPLACEMENT_STAGGER_SECONDS = 1.0
REPLACEMENT_RETRY_SECONDS = 3.0
#: The keeper stops its node after the job has had no supervisor this long (a replacement takes over sooner).
NODE_UNSUPERVISED_LIMIT_SECONDS = 30.0
STOP_GRACE_SECONDS = 3.0
LEFTOVER_GRACE_SECONDS = 1.0
#: How long a keeper sent SIGTERM may take to stop its node and exit: the node's grace, the leftovers' grace
#: and a margin. Whoever stops keepers (the supervisor, ``delete``) waits this long before SIGKILL.
KEEPER_STOP_SECONDS = STOP_GRACE_SECONDS + LEFTOVER_GRACE_SECONDS + 2.0
#: What a replacement supervisor exits with when the job is over or deleted: its keepers stop their nodes.
JOB_OVER_EXIT_CODE = 3

_PR_SET_CHILD_SUBREAPER = 36
_READ_BYTES = 256 * 1024
_libc = ctypes.CDLL(None, use_errno=True)


def exit_record_path(job_dir: Path, node: int) -> Path:
    return job_dir / "logs" / f"node-{node}.exit.json"


def exit_status(code: int) -> int:
    """A process exit status for ``code`` (negative: killed by that signal), as a shell reports it."""
    return code if code >= 0 else 128 - code


class Keeper:
    """Runs one node to its end; see the module docstring."""

    def __init__(self, spec: dict[str, Any], warm_node: WarmNode | None = None) -> None:
        self.spec = spec
        self.warm_node = warm_node
        self.job_dir = Path(spec["job_dir"])
        self.index: int = spec["node"]
        self.env: dict[str, str] = spec["env"]
        self.workers: dict[int, dict[str, Any]] = {}
        self.worker_fds: dict[int, int] = {}
        self.lost_output = 0
        #: Output dropped since the log last took a write (a full disk), not yet noted in the log.
        self.unreported_loss = 0
        self.stop_requested = False
        self.stop_deadline: float | None = None
        self.killed = False
        self.node_ended: float | None = None
        self.unsupervised_since: float | None = None
        self.next_replacement = 0.0
        self.replacement: subprocess.Popen[bytes] | None = None
        #: The node runs as a container (:mod:`~trainjob.backends.local.containers`): its name, engine and limit.
        self.container: dict[str, Any] | None = spec.get("container")
        self.container_state: dict[str, Any] | None = None
        #: The container's memory cgroup (from its first rank), where the OOM killer's kills are counted.
        self.container_cgroup: str | None = None
        self.oom_killed = False

    def _start_node(self, cpus: list[int],
                    mounts: list[Any] | None) -> tuple[subprocess.Popen[bytes], int] | None:
        """The node's process, started now, and the read end of its output; ``None`` when it cannot start."""
        output, write_end = os.pipe()
        preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        if mounts:  # the job's volumes, when it mounts them in a namespace
            from trainjob.backends.local.node_keeper.mounts import preexec as mounts_preexec

            preexec = functools.partial(mounts_preexec, [tuple(m) for m in mounts], self.spec["cwd"], cpus)
        try:
            node = subprocess.Popen(
                self.spec["argv"], cwd=self.spec["cwd"], env=self.env, stdin=subprocess.DEVNULL,
                stdout=write_end, stderr=write_end, process_group=0, preexec_fn=preexec,
            )
        except OSError as exc:
            os.close(output)
            self.log.write(f"[trainjob] cannot start node-{self.index}: {exc}\n".encode())
            return None
        finally:
            os.close(write_end)
        return node, output

    def run(self) -> int:
        with contextlib.suppress(OSError):
            exit_record_path(self.job_dir, self.index).unlink()
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        # A new attempt, unless the supervisor began this attempt's log itself (the package install, on node-0).
        self.log = NodeLogWriter(self.job_dir, self.index, self.spec["log_max_bytes"],
                                 new_attempt=not self.spec.get("continue_log", False))
        self.copies = TorchrunCopies(self.env.get("PET_LOG_DIR"), teed_all=self.env.get("PET_TEE") == "3")
        cpus = self.spec.get("cpus") or []
        mounts = self.spec["mounts"] if "mounts" in self.spec else _node_mounts(self.job_dir, self.index)
        started = None
        if self.warm_node is not None:
            usable = not mounts and self.spec.get("use_warm_node", True)  # a namespace's mounts need a new process
            started = self.warm_node.give(self.spec, cpus) if usable else None
            if started is None:
                self.warm_node.dismiss()
        if started is None:
            if self.container is not None:  # one of this name left by a killed keeper would refuse the new one
                self._remove_container()
            started = self._start_node(cpus, mounts)
        if started is None:
            self._write_exit(127, time.time())
            return 127
        self.node, output = started
        self.poller = select.poll()
        self.output, self.output_open = output, True
        self.poller.register(output, select.POLLIN)
        node_fd = os.pidfd_open(self.node.pid)
        self.poller.register(node_fd, select.POLLIN)
        due = dict.fromkeys(("scan", "release", "supervision"), 0.0)
        while self.node.returncode is None:
            events = self.poller.poll(POLL_SECONDS * 1000)
            woke = time.time()  # processes that ended in one wake-up get one time: their order is unknown
            for fd, _ in events:
                if fd == self.output:
                    self._copy_output()
                elif fd == node_fd:
                    self.node_ended = woke
                    self.poller.unregister(node_fd)
                else:
                    self._worker_ended(fd, woke)
            self._reap()
            now = time.monotonic()
            if self.stop_requested:
                self._stop(now)
            if now >= due["scan"]:
                self._scan_workers()
                due["scan"] = now + POLL_SECONDS
            if now >= due["release"]:
                self.copies.release(self.node.pid)
                due["release"] = now + RELEASE_SECONDS
            if now >= due["supervision"]:
                self._check_supervision(now)
                due["supervision"] = now + SUPERVISION_CHECK_SECONDS
        os.close(node_fd)
        ended = self.node_ended or time.time()
        if self.container is not None:
            self._end_container()
        self._stop_leftovers()
        self._drain_output()
        if self.unreported_loss:
            with contextlib.suppress(OSError):
                self.log.write(self._loss_line())
        self.log.close()
        self.copies.empty()
        self._write_exit(self.node.returncode, ended)
        return exit_status(self.node.returncode)

    # output

    def _copy_output(self) -> bool:
        """Copy what the pipe holds into the log; ``False`` once every writer closed it."""
        data = os.read(self.output, _READ_BYTES)
        if data:
            try:
                if self.unreported_loss:  # the disk has room again: say what is missing, once, where it is missing
                    self.log.write(self._loss_line())
                    self.unreported_loss = 0
                self.log.write(data)
            except OSError as exc:  # a full disk must not stop training: the output is dropped instead
                self.lost_output += len(data)
                self.unreported_loss += len(data)
                if self.lost_output == len(data):
                    _note(self.index, f"cannot write the node's log ({exc}); dropping output")
            return True
        if self.output_open:
            self.output_open = False
            self.poller.unregister(self.output)
        return False

    def _loss_line(self) -> bytes:
        lead = b"" if self.log.at_line_start else b"\n"
        return lead + (f"[trainjob] node-{self.index}: {self.unreported_loss} bytes of output were dropped here: "
                       "no space left on device for the log\n").encode()

    def _drain_output(self) -> None:
        deadline = time.monotonic() + 1.0
        while self.output_open and time.monotonic() < deadline:
            if not select.select([self.output], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            self._copy_output()
        os.close(self.output)

    # training processes

    def _scan_workers(self) -> None:
        # A container's processes are not the engine client's children: they are below the keeper (its runtime
        # monitor, orphaned, comes to the keeper, a subreaper), with RANK in their environment as anywhere.
        for pid in self._below() if self.container is not None else _children(self.node.pid):
            if pid in self.workers:
                continue
            try:
                env = _environ(pid)
                rank, local_rank = int(env["RANK"]), int(env["LOCAL_RANK"])
                fd = os.pidfd_open(pid)
            except (KeyError, ValueError, OSError):
                continue  # not a training process, or not exec'd yet: looked at again next time
            self.workers[pid] = {"pid": pid, "rank": rank, "local_rank": local_rank, "time": None}
            self.worker_fds[fd] = pid
            self.poller.register(fd, select.POLLIN)
            if self.container is not None:  # torchrun's report names the container's pids
                from trainjob.backends.local.containers import memory_cgroup, namespace_pid

                self.workers[pid]["ns_pid"] = namespace_pid(pid)
                if self.container_cgroup is None:
                    self.container_cgroup = memory_cgroup(pid)

    def _worker_ended(self, fd: int, when: float) -> None:
        self.workers[self.worker_fds.pop(fd)]["time"] = when
        self.poller.unregister(fd)
        os.close(fd)
        if self.container_cgroup is not None and not self.oom_killed:  # read while the cgroup still exists
            from trainjob.backends.local.containers import oom_kills

            self.oom_killed = oom_kills(self.container_cgroup) > 0

    # processes below the keeper

    def _reap(self) -> None:
        """Wait for ended children: the node, a replacement supervisor, and orphans re-parented here."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or not info.si_pid:
                return
            if info.si_pid == self.node.pid:
                self.node.poll()
            elif self.replacement is not None and info.si_pid == self.replacement.pid:
                self.replacement.poll()
            else:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(info.si_pid, 0)

    def _below(self) -> list[int]:
        """Every process below the keeper except a replacement supervisor it started and that one's own."""
        spared: set[int] = set()
        if self.replacement is not None and self.replacement.returncode is None:
            spared = {self.replacement.pid, *_descendants(self.replacement.pid)}
        return [pid for pid in _descendants(os.getpid()) if pid not in spared]

    def _stop(self, now: float) -> None:
        if self.stop_deadline is None:
            self.log.mark_stop()  # what the node prints from here on is shutdown, not a crash
            signal_group(self.node.pid, signal.SIGTERM)
            self.stop_deadline = now + STOP_GRACE_SECONDS
        elif now >= self.stop_deadline and not self.killed:
            self.killed = True
            signal_group(self.node.pid, signal.SIGKILL)
            _kill(self._below())
            if self.container is not None:
                self._remove_container()

    def _stop_leftovers(self) -> None:
        for _ in range(3):
            leftovers = self._below()
            if not leftovers:
                return
            import psutil

            processes = []
            for pid in leftovers:
                with contextlib.suppress(psutil.Error):
                    processes.append(psutil.Process(pid))
            stop_processes(processes, grace=LEFTOVER_GRACE_SECONDS)
            self._reap()

    # supervision

    def _check_supervision(self, now: float) -> None:
        if self.stop_requested or supervisor_lock_held(self.job_dir):
            self.unsupervised_since = None
            return
        if self.unsupervised_since is None:
            self.unsupervised_since = now
            _note(self.index, "the job's supervisor is gone")
        if self.replacement is not None and self.replacement.returncode == JOB_OVER_EXIT_CODE:
            _note(self.index, "the job is over or deleted; stopping the node")
            self.stop_requested = True
            return
        waited = now - self.unsupervised_since
        starting = self.replacement is not None and self.replacement.returncode is None
        if not starting and waited >= self.index * REPLACEMENT_STAGGER_SECONDS and now >= self.next_replacement:
            self._start_replacement()
            self.next_replacement = now + REPLACEMENT_RETRY_SECONDS
        if waited > NODE_UNSUPERVISED_LIMIT_SECONDS:
            _note(self.index, f"no supervisor for {NODE_UNSUPERVISED_LIMIT_SECONDS:g} s; stopping the node")
            self.stop_requested = True

    def _start_replacement(self) -> None:
        _note(self.index, "starting a replacement supervisor")
        try:
            with (self.job_dir / "supervisor.log").open("ab") as log:
                self.replacement = subprocess.Popen(
                    [sys.executable, "-m", "trainjob.backends.local.supervisor", self.spec["home"], self.spec["name"],
                     "--replace"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
        except OSError as exc:  # the job's directory is gone: so is the job
            _note(self.index, f"cannot start a replacement supervisor ({exc}); stopping the node")
            self.stop_requested = True

    def abort(self) -> None:
        """Kill the node and everything below the keeper: used when the keeper itself breaks."""
        node = getattr(self, "node", None)
        if node is not None:
            signal_group(node.pid, signal.SIGKILL)
        _kill(self._below())

    # a node that runs as a container

    def _engine(self) -> Any:
        from trainjob.backends.local.containers import Engine

        assert self.container is not None
        return Engine(self.container["engine"], self.container["engine_path"])

    def _remove_container(self) -> None:
        from trainjob.backends.local.containers import remove_container

        assert self.container is not None
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            remove_container(self._engine(), self.container["name"])

    def _end_container(self) -> None:
        """Learn how the node's container ended (OOM-killed?), say so in its log, and remove it unless kept."""
        from trainjob.backends.local.containers import container_state, memory_words

        assert self.container is not None
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self.container_state = container_state(self._engine(), self.container["name"])
        self.oom_killed = self.oom_killed or bool(self.container_state and self.container_state["oom_killed"])
        if self.oom_killed:
            limit = self.container["memory_bytes"]
            words = f" its memory limit of {memory_words(limit)}" if limit else " the memory it could get"
            self.log.write(f"[trainjob] container {self.container['name']} of node-{self.index} was OOMKilled: a "
                           f"process in it went over{words}\n".encode())
        if not self.container.get("keep"):
            self._remove_container()

    def _write_exit(self, code: int, ended: float) -> None:
        record = {"code": code, "time": ended, "stopped": self.stop_requested, "ranks": list(self.workers.values())}
        if self.container is not None:
            record["container"] = {"name": self.container["name"], "memory_bytes": self.container["memory_bytes"],
                                   "oom_killed": self.oom_killed}
        path = exit_record_path(self.job_dir, self.index)
        temporary = path.with_suffix(".tmp")
        with contextlib.suppress(OSError):  # the job's directory may be gone already
            temporary.write_text(json.dumps(record), encoding="utf-8")
            os.replace(temporary, path)


def _node_mounts(job_dir: Path, node: int) -> list[tuple[str, str, bool, int | None, bool]] | None:
    from trainjob.backends.local.node_keeper.mounts import node_mounts

    return node_mounts(job_dir, node)


def _environ(pid: int) -> dict[str, str]:
    """The environment process ``pid`` was started with (``OSError`` when it cannot be read)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = f.read().split(b"\0")
    return dict(entry.decode(errors="replace").split("=", 1) for entry in entries if b"=" in entry)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    found, frontier = [], [pid]
    while frontier:
        children = [child for parent in frontier for child in _children(parent)]
        found += children
        frontier = children
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    """Pids of ``pid``'s children, from the kernel's per-thread lists (psutil would read every process)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                found += [int(child) for child in f.read().split()]
    except OSError:
        import psutil

        with contextlib.suppress(psutil.Error):
            return [child.pid for child in psutil.Process(pid).children()]
    return found


def _note(index: int, message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} keeper of node-{index}: {message}", file=sys.stderr, flush=True)


def main(warm_node: WarmNode | None = None) -> int:
    """The keeper's process: its node's spec on stdin (after the line that started ``warm_node``, for a warm
    keeper)."""
    handed = sys.stdin.buffer.read().decode()
    if not handed.strip():  # a warm keeper for a job that did not come, or did not need this keeper
        if warm_node is not None:
            warm_node.dismiss()
        return 0
    spec = json.loads(handed)
    if spec.get("own_output"):  # a warm keeper, in the warm supervisor's process group
        os.setsid()
        join_job(Path(spec["job_dir"]))
    keeper = Keeper(spec, warm_node)

    def stop(signum: int, frame: object) -> None:
        keeper.stop_requested = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        return keeper.run()
    except BaseException:  # a broken keeper must not leave its node running unkept
        keeper.abort()
        raise

