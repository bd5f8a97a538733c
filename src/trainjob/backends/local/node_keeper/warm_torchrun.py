"""A warm torchrun: a node's torchrun, started with its imports under way before the node is known:
``python warm_torchrun.py``.

A warm keeper (:mod:`~trainjob.backends.local.supervisor.warm_keepers`) starts this process at once, with the
environment a node of a job created now would start with (the job's own variables aside). While the command still
reads, checks and creates the job, the warm torchrun imports what ``torch.distributed.run`` imports (about a
second of CPU: torchrun's own start, which every node otherwise pays before its first rank starts). The keeper
then writes the node on its stdin, one JSON line (``argv``, ``cwd``, ``env``, ``cpus``; an empty line or the end
of stdin: no node, exit), and the warm torchrun becomes that node's process, with the pid the keeper watches:

- **torchrun, warm**: when ``argv`` is this Python's ``-m torch.distributed.run``, the node's environment differs
  from the one this process started with only in what a node sets for torchrun (:func:`differences`), the node's
  directory shadows no module already imported (:func:`shadowed_modules`), and no other ``sitecustomize`` or
  ``usercustomize`` ran at this process's start, it takes the node's environment, directory and CPUs and runs
  ``torch.distributed.run`` as ``python -m`` does (as ``__main__``: torchrun's own modules, not that one, were
  imported warm); the node's ``sitecustomize`` (:mod:`~trainjob.backends.local.worker_site`) does for it what it
  does at a node's start.
- **anything else, cold**: it takes the node's directory and CPUs and ``exec``\\ s ``argv`` with the node's
  environment, as ``subprocess`` would have started it (signals as a new process has them), so the node is
  exactly the process it would have been, only with this pid. A command that cannot be started writes why into
  the node's output and exits 127.

A warm torchrun dies with its keeper until it is given a node (``PR_SET_PDEATHSIG``), so a command that made no
job leaves none behind. Only the standard library is imported here: a node imports nothing of trainjob's but its
``sitecustomize``.
"""

import ctypes
import json
import os
import signal
import sys
import threading

TORCHRUN_MODULE = "torch.distributed.run"
#: What ``torch.distributed.run`` imports (all but itself: it runs as ``__main__``, as under ``python -m``).
TORCHRUN_IMPORTS = (
    "torch", "torch.distributed.argparse_util", "torch.distributed.elastic.multiprocessing",
    "torch.distributed.elastic.multiprocessing.errors", "torch.distributed.elastic.rendezvous.utils",
    "torch.distributed.elastic.utils.logging", "torch.distributed.launcher.api", "torch.numa.binding",
    "torch.utils.backend_registration",
)
#: The variables that may differ between the warm torchrun's start and the node: what a node sets for torchrun
#: and its ranks, read once torchrun runs, never while it is imported. ``OMP_NUM_THREADS`` sizes the OpenMP pool
#: of the warm torchrun, which computes nothing (its ranks are new processes and read the node's value);
#: ``CUDA_VISIBLE_DEVICES`` is read when CUDA is first initialised, which the warm torchrun does only after it has
#: the node's environment (``--nproc-per-node gpu``); ``NCCL_*`` only by a process group, which the warm torchrun
#: has none of. Any other difference (``LOGLEVEL``, which torch's loggers read as they are made; a job's own
#: variables, which a user's ``sitecustomize`` may read) starts the node cold.
MAY_DIFFER = frozenset({"OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT"})
MAY_DIFFER_PREFIXES = ("PET_", "TORCHELASTIC_", "TRAINJOB_", "NCCL_")
_PR_SET_PDEATHSIG = 1
_CANNOT_START = 127


def differences(started: dict[str, str], node: dict[str, str]) -> list[str]:
    """Names whose values differ between ``started`` (the warm torchrun's start) and ``node`` that are not
    :data:`MAY_DIFFER`.

    >>> differences({"HOME": "/h"}, {"HOME": "/h", "PET_NNODES": "2", "OMP_NUM_THREADS": "1", "NCCL_DEBUG": "INFO"})
    []
    >>> differences({"HOME": "/h"}, {"HOME": "/g", "LD_PRELOAD": "x.so", "EPOCHS": "3"})
    ['EPOCHS', 'HOME', 'LD_PRELOAD']
    """
    names = sorted(name for name in set(started) | set(node) if started.get(name) != node.get(name))
    return [
        name for name in names
        if name.startswith("TRAINJOB_SITE_") or not (name in MAY_DIFFER or name.startswith(MAY_DIFFER_PREFIXES))
    ]


def relative_python_path(env: dict[str, str]) -> bool:
    """Whether ``PYTHONPATH`` names a folder relative to the current one (then it depends on where the process
    started)."""
    entries = env.get("PYTHONPATH")
    return entries is not None and any(not os.path.isabs(entry) for entry in entries.split(os.pathsep))


def shadowed_modules(directory: str) -> list[str]:
    """Modules already imported that a file or package in ``directory`` would have shadowed (``python -m``
    puts the directory first on ``sys.path``); unknown when it cannot be listed (``["?"]``)."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return ["?"]
    loaded = {name.partition(".")[0] for name in sys.modules} - {"__main__"}
    return sorted({entry.partition(".")[0] for entry in entries} & loaded)


class WarmTorchrun:
    def __init__(self, keeper: int) -> None:
        self.keeper = keeper
        self.imported = threading.Event()
        self.import_error: BaseException | None = None
        self.started_env = dict(os.environ)
        self.started_in = os.getcwd()

    def import_torchrun(self) -> None:
        try:
            for module in TORCHRUN_IMPORTS:
                __import__(module)
        except BaseException as exc:  # the node, started cold, reports it as it would
            self.import_error = exc
        finally:
            self.imported.set()

    def run(self) -> int:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != self.keeper:  # the keeper died before the line above
            return 0
        threading.Thread(target=self.import_torchrun, name="import-torchrun", daemon=True).start()
        line = sys.stdin.buffer.readline()
        if not line.strip():
            os._exit(0)  # no node: whatever is still importing ends with the process
        node = json.loads(line)
        libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(0), 0, 0, 0)  # a node outlives a broken keeper, as any node
        # As the keeper's own children have them: it ignores both before it starts a node.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        argv, env = node["argv"], node["env"]
        try:
            os.chdir(node["cwd"])
            if node.get("cpus"):
                os.sched_setaffinity(0, node["cpus"])
        except OSError as exc:
            return self.cannot_start(node, exc, exc.filename if exc.filename is not None else node["cwd"])
        if self.can_run_warm(argv, env):
            return self.run_torchrun(argv, env)
        return self.exec(node, argv, env)

    def can_run_warm(self, argv: list[str], env: dict[str, str]) -> bool:
        """Whether the node can run in this process as it would have run in a new one."""
        if argv[:3] != [sys.executable, "-m", TORCHRUN_MODULE] or differences(self.started_env, env):
            return False
        if relative_python_path(env) and os.getcwd() != self.started_in:
            return False
        self.imported.wait()
        site = sys.modules.get("sitecustomize")
        return (self.import_error is None and TORCHRUN_MODULE not in sys.modules
                and callable(getattr(site, "node_started", None))
                and not getattr(site, "SHADOWED", None) and "usercustomize" not in sys.modules
                and not shadowed_modules(os.getcwd()))

    def run_torchrun(self, argv: list[str], env: dict[str, str]) -> int:
        import runpy

        os.environ.clear()
        os.environ.update(env)
        sys.path[0] = os.getcwd()  # where ``python -m`` puts it
        sys.argv = [sys.argv[0], *argv[3:]]  # argv[0] becomes the module's file
        sys.modules["sitecustomize"].node_started()
        # What ``python -m torch.distributed.run`` calls: the module runs as ``__main__``, in this script's place.
        runpy._run_module_as_main(TORCHRUN_MODULE)  # type: ignore[attr-defined]
        return 0

    def exec(self, node: dict, argv: list[str], env: dict[str, str]) -> int:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.closerange(3, _max_fd())  # what subprocess closes in a new process (close_fds)
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # as subprocess restores them for a new process
            signal.signal(signum, signal.SIG_DFL)
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            return self.cannot_start(node, exc, argv[0])
        return _CANNOT_START  # not reached

    @staticmethod
    def cannot_start(node: dict, exc: OSError, what: object) -> int:
        """Say why the node's command could not start, as its keeper would have (into the node's output)."""
        reason = f"[Errno {exc.errno}] {exc.strerror}: {what!r}" if exc.errno is not None else str(exc)
        os.write(2, f"[trainjob] cannot start node-{node.get('node', 0)}: {reason}\n".encode())
        return _CANNOT_START


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 1 << 16


if __name__ == "__main__":
    sys.exit(WarmTorchrun(int(sys.argv[1])).run())
