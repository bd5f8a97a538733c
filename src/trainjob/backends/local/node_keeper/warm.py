"""A node's torchrun, started with its imports under way before the node is known: ``python warm.py``.

A keeper started ahead of its job (:mod:`~trainjob.backends.local.supervisor.standby`) starts this launcher at
once, with the environment a node of a job created now would start with (the job's own variables aside). While
the command still reads, checks and creates the job, the launcher imports ``torch.distributed.run`` (about a
second of CPU: torchrun's own start, which every node otherwise pays before its first rank starts). The keeper
then writes the node on its stdin, one JSON line (``argv``, ``cwd``, ``env``, ``cpus``; an empty line or the end
of stdin: no node, exit), and the launcher becomes that node's process, with the pid the keeper watches:

- **torchrun, warm**: when ``argv`` is this Python's ``-m torch.distributed.run`` and nothing that Python, the
  dynamic loader or torch read while starting differs between the launcher's environment and the node's
  (:func:`differences_read_at_start`), and the node's directory shadows no module already imported
  (:func:`shadowed_modules`), the launcher takes the node's environment, directory and CPUs and runs torchrun's ``main``,
  as its ``__main__`` block (and the ``torchrun`` script) does; the node's ``sitecustomize`` (:mod:`~trainjob.backends.local.worker_site`)
  does for it what it does at a node's start.
- **anything else, cold**: the launcher takes the node's directory and CPUs and ``exec``\\ s ``argv`` with the
  node's environment, as ``subprocess`` would have started it (signals as a new process has them), so the node
  is exactly the process it would have been, only with this pid. A command that cannot be started writes why
  into the node's output and exits 127.

The launcher dies with its keeper until it is given a node (``PR_SET_PDEATHSIG``), so a command that made no job
leaves none behind. Only the standard library is imported here: a node imports nothing of trainjob's but its
``sitecustomize``.
"""

import ctypes
import json
import os
import signal
import sys
import threading

TORCHRUN_MODULE = "torch.distributed.run"
#: What a node sets for torchrun and its ranks, read only once torchrun runs (never while torch is imported):
#: these may differ between the launcher's start and the node. ``OMP_NUM_THREADS`` sizes the OpenMP pool of
#: the launcher, which computes nothing; its ranks are new processes and read the node's value.
#: ``CUDA_VISIBLE_DEVICES`` is read when CUDA is first initialised, which the launcher does only after it has the
#: node's environment (``--nproc-per-node gpu``).
SET_FOR_THE_NODE = frozenset({"OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT"})
SET_FOR_THE_NODE_PREFIXES = ("PET_", "TORCHELASTIC_", "TRAINJOB_")
#: What Python (its start, the user site, locale and encodings), the dynamic loader, the C library, OpenMP, BLAS
#: and torch read while ``torch.distributed.run`` is imported: a node whose value differs from the launcher's
#: starts cold.
READ_AT_START = frozenset({"HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "GLIBC_TUNABLES", "PATH"})
READ_AT_START_PREFIXES = (
    "PYTHON", "LD_", "LC_", "TORCH", "PYTORCH_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "NPY_", "NUMPY_",
    "MALLOC_", "CUDA_", "TRAINJOB_SITE_",
)
_PR_SET_PDEATHSIG = 1
_CANNOT_START = 127


def differences_read_at_start(launcher: dict[str, str], node: dict[str, str]) -> list[str]:
    """Names whose values differ between ``launcher`` and ``node`` and that are read while torch is imported.

    >>> differences_read_at_start({"HOME": "/h"}, {"HOME": "/h", "PET_NNODES": "2", "OMP_NUM_THREADS": "1"})
    []
    >>> differences_read_at_start({"HOME": "/h"}, {"HOME": "/g", "LD_PRELOAD": "x.so", "NCCL_DEBUG": "INFO"})
    ['HOME', 'LD_PRELOAD']
    """
    names = sorted(name for name in set(launcher) | set(node) if launcher.get(name) != node.get(name))
    return [
        name for name in names
        if name.startswith("TRAINJOB_SITE_")
        or not (name in SET_FOR_THE_NODE or name.startswith(SET_FOR_THE_NODE_PREFIXES))
        and (name in READ_AT_START or name.startswith(READ_AT_START_PREFIXES))
    ]


def shadowed_modules(directory: str) -> list[str]:
    """Modules already imported that a file or package in ``directory`` would have shadowed (``python -m``
    puts the directory first on ``sys.path``); unknown when it cannot be listed (``["?"]``)."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return ["?"]
    loaded = {name.partition(".")[0] for name in sys.modules} - {"__main__"}
    return sorted({entry.partition(".")[0] for entry in entries} & loaded)


class Launcher:
    def __init__(self) -> None:
        self.imported = threading.Event()
        self.import_error: BaseException | None = None
        self.started_env = dict(os.environ)

    def import_torchrun(self) -> None:
        try:
            __import__(TORCHRUN_MODULE)
        except BaseException as exc:  # the node, started cold, reports it as it would
            self.import_error = exc
        finally:
            self.imported.set()

    def run(self) -> int:
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the keeper died before the line above
            return 0
        threading.Thread(target=self.import_torchrun, name="import-torchrun", daemon=True).start()
        line = sys.stdin.buffer.readline()
        if not line.strip():
            os._exit(0)  # no node: whatever is still importing ends with the process
        node = json.loads(line)
        libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(0), 0, 0, 0)  # a node outlives a broken keeper, as any node
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        argv, env = node["argv"], node["env"]
        try:
            os.chdir(node["cwd"])
            if node.get("cpus"):
                os.sched_setaffinity(0, node["cpus"])
        except OSError as exc:
            return self.cannot_start(node, exc, exc.filename)
        if self.warm(argv, env):
            return self.run_torchrun(argv, env)
        return self.exec(node, argv, env)

    def warm(self, argv: list[str], env: dict[str, str]) -> bool:
        if argv[:3] != [sys.executable, "-m", TORCHRUN_MODULE] or differences_read_at_start(self.started_env, env):
            return False
        self.imported.wait()
        site = sys.modules.get("sitecustomize")
        return (self.import_error is None and callable(getattr(site, "node_started", None))
                and not shadowed_modules(os.getcwd()))

    def run_torchrun(self, argv: list[str], env: dict[str, str]) -> int:
        os.environ.clear()
        os.environ.update(env)
        sys.path[0] = os.getcwd()  # where ``python -m`` puts it
        torchrun = sys.modules[TORCHRUN_MODULE]
        sys.argv = [torchrun.__file__, *argv[3:]]  # as under ``python -m``
        sys.modules["sitecustomize"].node_started()
        torchrun.main()  # what its ``__main__`` block does (and the ``torchrun`` script, which exits with it)
        return 0

    def exec(self, node: dict, argv: list[str], env: dict[str, str]) -> int:
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # as subprocess restores them for a new process
            signal.signal(signum, signal.SIG_DFL)
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            for signum in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(signum, signal.SIG_IGN)
            return self.cannot_start(node, exc, argv[0])
        return _CANNOT_START  # not reached

    @staticmethod
    def cannot_start(node: dict, exc: OSError, what: object) -> int:
        """Say why the node's command could not start, as its keeper would have (into the node's output)."""
        os.write(2, f"[trainjob] cannot start node-{node.get('node', 0)}: [Errno {exc.errno}] {exc.strerror}: "
                    f"{what!r}\n".encode())
        return _CANNOT_START


if __name__ == "__main__":
    sys.exit(Launcher().run())
