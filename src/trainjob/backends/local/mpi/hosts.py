"""MPI jobs on this machine: the launcher's ``mpirun`` starts each host's ranks inside that host's node process.

A plan with ``mlPolicy.mpi`` (:mod:`trainjob.runtime.plugins.mpi`) has hosts, each running ``slots`` ranks. Locally
node ``i`` plays host ``i`` of the hostfile, and node 0 also plays the launcher (with ``runLauncherAsNode`` it is
host 0 on a cluster too; without, the launcher's pod has no ranks and here shares node-0's process). Their launch
spec is :func:`trainjob.backends.local.process_specs.build_mpi_process_spec`; this module is what they run:

- **Nodes** (``python -m trainjob.backends.local.mpi node``) play the node pods' ``sshd``: each listens on a socket
  of its own (abstract, named after the job's directory and the node) and runs what ``mpirun`` asks for there
  (OpenMPI's ``orted``) through ``/bin/sh -c``, as ``sshd`` would, as its own child: with that node's environment,
  CPUs, GPUs and log. They stay up until the launcher says it is done, then exit 0.
- **The launcher** (``python -m trainjob.backends.local.mpi launcher mpirun ...``) waits until every host
  answers, writes the hostfile (``{job dir}/mpi/hostfile``, the ConfigMap's lines), then runs the TrainJob's
  command with ``OMPI_MCA_plm_rsh_agent`` pointing to :mod:`trainjob.backends.local.mpi.rsh`, which hands each
  ``orted`` to its host's node instead of ``ssh``. ``OMPI_ALLOW_RUN_AS_ROOT`` is set only here, when running as
  root; binding is left to the nodes' CPU sets (``hwloc_base_binding_policy=none``).
- **Output.** ``mpirun`` forwards every rank's output to the launcher, as on a cluster; the launcher has it tagged
  (``--tag-output``) and writes each rank's lines, prefixed ``[rank<N>]: ``, into the log of the node that runs
  the rank (:mod:`trainjob.backends.local.mpi.output`), so ``trainjob logs --node/--rank`` read them there.
- **Failures.** When ``mpirun`` fails, the launcher prints a failure report in torchrun's format naming the first
  rank ``mpirun`` saw fail (its host, local rank and exit code), so the job's status names that rank and its
  exception (:mod:`trainjob.backends.local.supervisor.failures`); the job fails with ``mpirun``'s exit code. The job
  completes when the launcher completes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from trainjob.backends.local.mpi.output import RankLines, RankRelay, failure_report
from trainjob.constants import JOB_DIR_ENV

MODULE = "trainjob.backends.local.mpi"
RSH_MODULE = "trainjob.backends.local.mpi.rsh"
HOSTS_ENV = "TRAINJOB_MPI_HOSTS"
NODE_ENV = "TRAINJOB_MPI_NODE"
SLOTS_ENV = "TRAINJOB_MPI_SLOTS"
#: How long the launcher waits for every host to answer before it gives up.
HOSTS_READY_SECONDS = 120.0
#: What ``mpirun`` needs to run as root, set on the launcher only (a container would run as its own user).
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
#: Commands that are ``mpirun``: the local backend checks that one is installed before the job starts.
MPIRUN_NAMES = ("mpirun", "mpiexec", "orterun")


def hostfile_path(job_dir: Path) -> Path:
    """Where the launcher writes the hostfile (the ConfigMap's ``hostfile`` on a cluster)."""
    return job_dir / "mpi" / "hostfile"


def host_tmpdir(job_dir: Path, node: int | None) -> Path:
    """The temporary folder (``TMPDIR``) of host ``node``, or of the launcher's ``mpirun`` (``None``).

    Each pod of an MPI job has a ``/tmp`` of its own. Here every host is this machine, and OpenMPI's daemons keep
    their session folders in ``$TMPDIR/ompi.<hostname>.<uid>/jf.<job family>``: daemons of one job started at once
    on one machine with one ``TMPDIR`` race to create it, and the loser fails to start ("ORTE was unable to
    reliably start one or more daemons", exit code 213, after "A call to mkdir ... File exists"). So each host,
    and ``mpirun`` beside host 0, gets a folder of its own in the job's folder, gone with the job."""
    return job_dir / "mpi" / ("tmp-launcher" if node is None else f"tmp-node-{node}")


def _gave_tmpdir(environ: Mapping[str, str], node: int) -> bool:
    """Whether ``TMPDIR`` in ``environ`` is the one :func:`host_tmpdir` gave host ``node`` (a job may name its
    own, which is then left as it is)."""
    job_dir = environ.get(JOB_DIR_ENV)
    return bool(job_dir) and environ.get("TMPDIR") == str(host_tmpdir(Path(job_dir), node))


def _make_own_tmpdir(job_dir: str, node: int | None) -> None:
    """Create the temporary folder of host ``node`` (of ``mpirun``: ``None``) unless the job named its own."""
    if _gave_tmpdir(os.environ, 0 if node is None else node):
        host_tmpdir(Path(job_dir), node).mkdir(parents=True, exist_ok=True)


def socket_address(job_dir: str | Path, node: int) -> str:
    """The abstract socket node ``node`` of the job in ``job_dir`` listens on (no file to clean up)."""
    digest = hashlib.sha256(str(job_dir).encode()).hexdigest()[:24]
    return f"\0trainjob-mpi-{digest}-{node}"


def request(job_dir: str | Path, node: int, message: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """Send ``message`` to node ``node``'s host server and return its answer (one JSON line each way)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(socket_address(job_dir, node))
        conn.sendall(json.dumps(message).encode() + b"\n")
        reply = conn.makefile("rb").readline()
    if not reply:
        raise ConnectionError(f"node-{node} closed the connection without an answer")
    return json.loads(reply)


def _lines_connection(job_dir: str, node: int) -> socket.socket:
    """A connection to node ``node``'s host server that writes what it is sent into that node's log."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_address(job_dir, node))
        conn.sendall(b'{"op": "lines"}\n')
    except OSError:
        conn.close()
        raise
    return conn


class HostServer:
    """What a node pod's ``sshd`` does for ``mpirun``: runs the commands it is sent, here, until told to finish."""

    def __init__(self, job_dir: str, node: int, out: TextIO) -> None:
        self.job_dir, self.node, self.out = job_dir, node, out
        self.finished = threading.Event()
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(socket_address(job_dir, node))
        self.sock.listen(16)
        self.sock.settimeout(0.2)

    def serve(self) -> None:
        while not self.finished.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()
        self.sock.close()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(None)
            reader = conn.makefile("rb")
            try:
                message = json.loads(reader.readline() or b"{}")
            except ValueError:
                return
            op = message.get("op")
            if op == "run":
                code = self._run(conn, str(message["command"]))
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"code": code}).encode() + b"\n")
                return
            if op == "lines":  # a rank of this host's lines, relayed by the launcher
                while data := reader.readline():
                    self.write(data.decode("utf-8", errors="replace"))
                return
            if op == "finish":
                self.finished.set()
            with contextlib.suppress(OSError):
                conn.sendall(b'{"ok": true}\n')

    def _run(self, conn: socket.socket, command: str) -> int:
        """Run ``command`` as ``sshd`` would; stop it when the caller (``mpirun``'s agent) goes away."""
        self.note(f"mpirun starts: {command.strip()[:200]}")
        process = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=self.out,
                                   stderr=self.out)
        watcher = threading.Thread(target=_stop_when_closed, args=(conn, process), daemon=True)
        watcher.start()
        code = process.wait()
        self.note(f"what mpirun started here exited with code {code}")
        return code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it

    def note(self, text: str) -> None:
        self.write(f"[trainjob] node-{self.node}: {text}\n")

    def write(self, text: str) -> None:
        with self.lock:
            self.out.write(text)
            self.out.flush()


def _stop_when_closed(conn: socket.socket, process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        while conn.recv(1024):
            pass
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(3)
        except subprocess.TimeoutExpired:
            process.kill()


def run_node() -> int:
    """A node that is not the launcher: serve ``mpirun`` until the launcher is done."""
    job_dir, node = os.environ[JOB_DIR_ENV], int(os.environ[NODE_ENV])
    _make_own_tmpdir(job_dir, node)
    server = HostServer(job_dir, node, sys.stdout)
    server.note(f"host {json.loads(os.environ[HOSTS_ENV])[node]} is ready for mpirun")
    server.serve()
    server.note("the launcher is done")
    return 0


def run_launcher(command: list[str]) -> int:
    """Node 0: serve host 0, wait for every host, run ``command`` (``mpirun ...``) and report how it ended."""
    job_dir, hosts = os.environ[JOB_DIR_ENV], json.loads(os.environ[HOSTS_ENV])
    _make_own_tmpdir(job_dir, 0)
    _make_own_tmpdir(job_dir, None)
    server = HostServer(job_dir, 0, sys.stdout)
    threading.Thread(target=server.serve, daemon=True).start()
    try:
        missing = _wait_for_hosts(job_dir, len(hosts))
        if missing:
            server.note(f"launcher: host(s) {', '.join(hosts[i] for i in missing)} did not answer within "
                        f"{HOSTS_READY_SECONDS:g} s; mpirun was not started")
            return 1
        path = hostfile_path(Path(job_dir))
        path.parent.mkdir(parents=True, exist_ok=True)
        slots = int(os.environ[SLOTS_ENV])
        path.write_text("".join(f"{host} slots={slots}\n" for host in hosts), encoding="utf-8")
        code = _run_mpirun(command, server, hosts, slots)
    finally:
        _finish_hosts(job_dir, len(hosts))
        server.finished.set()
    return code


def mpirun_env(environ: dict[str, str]) -> dict[str, str]:
    """The launcher's environment for ``mpirun``: the rsh agent, tagged output, no binding, root allowed, and a
    temporary folder apart from host 0's (:func:`host_tmpdir`) unless the job named its own."""
    env = dict(environ)
    if _gave_tmpdir(environ, 0):
        env["TMPDIR"] = str(host_tmpdir(Path(environ[JOB_DIR_ENV]), None))
    env.update(
        OMPI_MCA_plm_rsh_agent=f"{sys.executable} -m {RSH_MODULE}",
        OMPI_MCA_orte_tag_output="1",
        OMPI_MCA_hwloc_base_binding_policy="none",
    )
    if os.geteuid() == 0:
        env.update(ROOT_ENV)
    return env


def _wait_for_hosts(job_dir: str, count: int) -> list[int]:
    """The hosts that did not answer within :data:`HOSTS_READY_SECONDS` (none: all are ready)."""
    waiting = list(range(count))
    deadline = time.monotonic() + HOSTS_READY_SECONDS
    while waiting and time.monotonic() < deadline:
        for node in list(waiting):
            with contextlib.suppress(OSError, ValueError, ConnectionError):
                request(job_dir, node, {"op": "ping"}, timeout=2)
                waiting.remove(node)
        if waiting:
            time.sleep(0.1)
    return waiting


def _finish_hosts(job_dir: str, count: int) -> None:
    for node in range(1, count):
        with contextlib.suppress(OSError, ValueError, ConnectionError):
            request(job_dir, node, {"op": "finish"}, timeout=2)


def _run_mpirun(command: list[str], server: HostServer, hosts: list[str], slots: int) -> int:
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=mpirun_env(dict(os.environ)))
    assert process.stdout is not None
    relay = RankRelay(len(hosts), slots, server.write, functools.partial(_lines_connection, server.job_dir))
    untag = RankLines(server.write, relay.line)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: process.terminate())
    try:
        while chunk := os.read(process.stdout.fileno(), 65536):
            untag.feed(chunk.decode("utf-8", errors="replace"))
    finally:
        signal.signal(signal.SIGTERM, previous)
        code = process.wait()
        untag.close()
        relay.close()
    if code != 0:
        report = failure_report(untag.launcher_text, hosts, slots, code, relay.exceptions, Path(server.job_dir))
        if report:
            server.write(report)
    return code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["node"]:
        return run_node()
    if args[:1] == ["launcher"] and len(args) > 1:
        return run_launcher(args[1:])
    print(f"usage: python -m {MODULE} node | launcher COMMAND...", file=sys.stderr)
    return 2

