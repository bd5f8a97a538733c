"""Run at start-up by every Python process of a local job's node; makes failures say what failed.

- **A training process** (torchrun's worker: ``LOCAL_RANK`` and ``TORCHELASTIC_ERROR_FILE`` are set) that ends
  with an uncaught exception writes it to ``TORCHELASTIC_ERROR_FILE`` in torchelastic's format, as a script
  decorated with ``@record`` would (a script's own ``@record`` wins: an existing file is kept). torchrun then
  reports the exception as the rank's error, and the job's status names it.
- **The node's torchrun** prints its failure report (``ChildFailedError``) without the traceback of torchrun's own
  frames, each failed rank's traceback cut to its exception line (the rank printed the whole traceback just
  before), and a stop by signal (``SignalException``: the job is being stopped, suspended or deleted, or a peer
  node failed) as one line instead of a traceback that looks like a crash.
- **A training process** also dumps the Python stacks of all its threads into
  ``TRAINJOB_STACKS_DIR/rank-<RANK>-<pid>.txt`` when it gets ``TRAINJOB_STACKS_SIGNAL`` (:mod:`faulthandler`,
  which writes from the signal handler itself, so a rank blocked in a C call answers too): what ``trainjob
  stacks`` and the stall watch read (:mod:`trainjob.backends.local.stacks`).
- **A training process** that imports ``torch.distributed`` says whether its collectives complete, for the stall
  watch of a job that does not report progress (:func:`trainjob.backends.stall.collectives_overdue`): torch's
  flight recorder, on by default (``TORCH_FR_BUFFER_SIZE``, 2000 entries unless set), counts per process group the
  collectives enqueued and completed, whoever issued them (the script, or DDP's bucketed all-reduces from C++). A
  thread (:func:`_watch_collectives`) reads the counts every :data:`_COLLECTIVES_POLL_SECONDS` and, when they
  change, rewrites ``TRAINJOB_STACKS_DIR/collectives-rank-<RANK>-<pid>.json``: ``{"rank", "pid", "completed_at",
  "waiting_since"}``, Unix seconds or ``null`` (:class:`trainjob.backends.stall.RankCollectives`). Nothing is
  written before the first collective; a torch without the flight recorder, or a job that sets its buffer to 0,
  writes nothing, and the job is not watched. The recorder's dumps (NCCL's on a timeout) go to the stacks folder
  rather than ``/tmp`` unless ``TORCH_FR_DUMP_TEMP_FILE`` is set.
- **A training process of a Kubernetes pod** (this file loaded by :mod:`trainjob.pod_site`, which calls
  :func:`pod_main`; ``_main`` runs only when Python loads it as ``sitecustomize``) follows its collectives the same
  way, posts them to the operator every few seconds and writes its stacks to its log when they stop
  (:func:`_collectives_post`).

- **The node's torchrun** ends as soon as its ranks' output is copied: torchrun tees each rank's output
  (``PET_TEE``, so the node log has it line by line, prefixed with its rank) through tailer threads that sleep
  0.1 s whenever they find nothing new, and at the end it stops them one log at a time, each waiting out a sleep
  (about 0.2 s of every job's end). Its tailers wait on their stop signal instead, and copy a line a rank wrote
  in pieces as one line, when torch's tailer is the one this was written against (:func:`_tail_logfile`);
  otherwise torch's is left as it is.
- **A training process** whose output meets a full disk (torchrun writes each rank's output into a file under the
  job's logs) drops that output instead of dying of it (``print`` raising ``ENOSPC`` would end the training), and
  once the disk has room again says, once, how much went missing.

- **A training process and the node's torchrun** leave what they built out of the interpreter's last garbage
  collections at exit (:func:`_freeze_at_exit`): walking torch's objects there costs each about a quarter of a
  CPU-second, paid by every rank and node at the end of every job (plain torchrun pays it too). Exit handlers run
  and files are flushed as before; garbage in reference cycles is no longer finalized at exit (Python does not
  promise that anyway).

Processes the training process starts (data loader workers, subprocesses) are left alone. Costs next to nothing
at start-up: ``os`` and ``sys``, for a training process ``faulthandler`` and ``signal`` and for both ``atexit``
and ``gc`` (all built in), and one open file; the thread starts once ``torch.distributed`` is imported. A
collective costs nothing more than torch's own flight recorder entry, each read of the counts a few microseconds
(``benchmarks/stall_any_script.py``).
"""

import os
import sys

_WORKER_MARK = "TRAINJOB_SITE_WORKER_PID"
_NODE_MARK = "TRAINJOB_SITE_NODE_PID"
_STACK_DUMP_FILE = None
#: The ``sitecustomize`` this one loaded after itself, if any (a warm torchrun runs no node whose start such a
#: module might have seen differently: :mod:`trainjob.backends.local.node_keeper.warm_torchrun`).
SHADOWED = None


def _write_error_file(path, exc_type, exc, tb):
    import json
    import time
    import traceback

    if os.path.exists(path):
        return
    record = {
        "message": {
            "message": f"{exc_type.__name__}: {exc}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(exc_type, exc, tb)),
                "timestamp": str(int(time.time())),
            },
        }
    }
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(record, f)
    except OSError:
        pass


def _install_worker_hook(path):
    previous = sys.excepthook

    def record_then_report(exc_type, exc, tb):
        if not issubclass(exc_type, KeyboardInterrupt):
            _write_error_file(path, exc_type, exc, tb)
        previous(exc_type, exc, tb)

    sys.excepthook = record_then_report


def _register_stack_dumps(directory, signum):
    import faulthandler

    try:
        os.makedirs(directory, exist_ok=True)
        name = f"rank-{os.environ.get('RANK', 'x')}-{os.getpid()}.txt"
        dump = open(os.path.join(directory, name), "w")  # noqa: SIM115 (open for the process's life)
        faulthandler.register(int(signum), file=dump, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return  # no dumps for this rank; training is not affected
    global _STACK_DUMP_FILE
    _STACK_DUMP_FILE = dump  # kept open for the process's life: faulthandler writes to its descriptor


_COLLECTIVES_POLL_SECONDS = 0.5
_C10D_MODULE = "torch.distributed.distributed_c10d"


def _keep_flight_recorder_dumps(directory):
    """The flight recorder's dumps (an NCCL timeout's) into the stacks folder, unless the job says where."""
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(directory, "flight-recorder-rank-"))


def _collective_counts(dump):
    """``{process group: (enqueued, completed)}`` from the flight recorder (``dump``: torch's
    ``_dump_fr_trace_json``)."""
    import json

    status = json.loads(dump(False, False)).get("pg_status") or {}
    return {group: (int(seen.get("last_enqueued_collective", -1)), int(seen.get("last_completed_collective", -1)))
            for group, seen in status.items()}


def _watch_collectives(publish, stop, poll=_COLLECTIVES_POLL_SECONDS):
    """Follow this rank's collectives until ``stop`` is set, calling ``publish(state, now)`` after every read once
    a collective was seen; ``state`` is ``{"completed_at", "waiting_since"}`` (the module's docstring says what
    they hold) and ``publish`` returns whether the watch goes on."""
    import time

    c10d = getattr(sys.modules.get("torch._C"), "_distributed_c10d", None)
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return  # a torch without the flight recorder: the job is not watched
    completed, state = {}, {"completed_at": None, "waiting_since": None}
    while not stop.wait(poll):
        try:
            counts = _collective_counts(dump)
        except Exception:
            return  # torch changed what it dumps: not watched, training goes on
        if not counts:
            continue  # no collective yet
        now = time.time()
        done = {group: pair[1] for group, pair in counts.items()}
        waiting = any(enqueued > finished for enqueued, finished in counts.values())
        if done != completed and any(seq >= 1 for seq in done.values()):
            state["completed_at"] = now
            state["waiting_since"] = now if waiting else None
        elif not waiting:
            state["waiting_since"] = None
        elif state["waiting_since"] is None:
            state["waiting_since"] = now
        completed = done
        if not publish(dict(state), now):
            return


def _collectives_file(directory, rank):
    """A ``publish`` for :func:`_watch_collectives` on this machine: the state, when it changed, in
    ``directory/collectives-rank-<RANK>-<pid>.json`` (the local stall watch reads it)."""
    import json

    path = os.path.join(directory, f"collectives-rank-{rank}-{os.getpid()}.json")
    last = {}

    def publish(state, now):
        if state != last:
            last.clear()
            last.update(state)
            try:
                with open(path + ".tmp", "w") as f:
                    json.dump({"rank": rank, "pid": os.getpid(), **state}, f)
                os.replace(path + ".tmp", path)
            except OSError:
                pass  # a full disk: tried again at the next change
        return True

    return publish


#: How often a pod's rank tells the operator about its collectives, at most and at least (a fifth of the time
#: after which it dumps its stacks, within these bounds).
_POD_HEARTBEAT_SECONDS = (1.0, 30.0)
#: A pod's rank that does not report progress dumps its stacks after this long without a collective completing,
#: when ``TRAINJOB_STALL_DUMP`` is ``auto``: half the operator's default limit for such a job (5 minutes).
_POD_AUTO_DUMP_SECONDS = 150.0


def _pod_stacks_after(setting):
    """Seconds without a completed collective after which a pod's rank dumps its stacks (``TRAINJOB_STALL_DUMP``
    is ``setting``); ``None``: never (``off``, or not a number)."""
    if not setting or setting == "off":
        return None
    if setting == "auto":
        return _POD_AUTO_DUMP_SECONDS
    try:
        seconds = float(setting)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def _collectives_post(url, token_file, ca_file, rank, stacks_after):
    """A ``publish`` for :func:`_watch_collectives` in a Kubernetes pod: every heartbeat, the state as ages
    (``{"rank", "completedAgo", "waitingFor"}``, seconds: the pod's clock and the operator's need not agree)
    posted to the operator's ``/collectives`` endpoint with the pod's projected token; and once per stall, this
    rank's stacks in its log when no collective completed for ``stacks_after`` seconds, which the operator reads
    to name the stuck rank (the lines :func:`trainjob.log_stacks.stacks_in_log` reads). An endpoint that refuses
    the report for good (a 4xx other than 429) ends the watch; one that cannot be reached is tried again."""
    import json
    import ssl
    import time
    import urllib.error
    import urllib.request

    low, high = _POD_HEARTBEAT_SECONDS
    heartbeat = min(max(stacks_after / 5.0, low), high)
    sent = {"at": 0.0, "dumped": False}
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https:") else None

    def post(state, now):
        completed, waiting = state["completed_at"], state["waiting_since"]
        body = {"rank": rank, "completedAgo": None if completed is None else round(now - completed, 3),
                "waitingFor": None if waiting is None else round(now - waiting, 3)}
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
            request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=10, context=context) as answer:
                answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code >= 500 or exc.code == 429
        except (OSError, ValueError):
            pass  # the operator away for a while (a new leader): the next heartbeat tries again
        return True

    def dump_stacks(silent):
        import faulthandler
        import tempfile

        try:
            from trainjob.log_stacks import stacks_for_log
        except ImportError:
            return
        with tempfile.TemporaryFile(mode="w+") as scratch:
            faulthandler.dump_traceback(file=scratch, all_threads=True)
            scratch.seek(0)
            text = stacks_for_log(rank, silent, scratch.read())
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def publish(state, now):
        since = state["completed_at"] if state["completed_at"] is not None else state["waiting_since"]
        silent = None if since is None else now - since
        if silent is None or silent < stacks_after:
            sent["dumped"] = False
        elif not sent["dumped"]:  # once per stall, whether this rank waits in a collective or is stuck outside
            sent["dumped"] = True
            dump_stacks(silent)
        if now - sent["at"] < heartbeat and sent["at"]:
            return True
        sent["at"] = time.time()
        return post(state, now)

    return publish


def _start_collectives_watch(publish):
    """Start :func:`_watch_collectives` on a thread of its own, stopped at exit before torch is torn down."""
    import atexit
    import json  # noqa: F401 (imported here, not first on the thread while the script's imports run)
    import threading
    import time  # noqa: F401

    stop = threading.Event()
    thread = threading.Thread(target=_watch_collectives, args=(publish, stop), name="trainjob-collectives",
                              daemon=True)
    thread.start()

    def stop_watching():
        stop.set()
        thread.join(1.0)

    atexit.register(stop_watching)


def _short_tracebacks(report):
    """torchrun's failure report with each ``traceback :`` block cut to the exception it ends with."""
    import re

    next_part = re.compile(r"^(=+|-+|\[\d+\]:|  (time|host|rank|exitcode|error_file|traceback) *:)")
    out, block = [], None
    for line in report.splitlines() + [""]:
        if block is not None:
            if not next_part.match(line) and line != "":
                block.append(line)
                continue
            frames_end = max((k for k, text in enumerate(block) if text.startswith("    ")), default=-1)
            rest = [text.strip() for text in block[frames_end + 1 :] if text.strip()]
            out.append("  traceback : " + (rest[0] if rest else ""))
            block = None
        if line.startswith("  traceback : Traceback (most recent call last):"):
            block = []
            continue
        out.append(line)
    return "\n".join(out[:-1])


def _install_torchrun_hook():
    previous = sys.excepthook

    def short_report(exc_type, exc, tb):
        name = exc_type.__name__
        if name == "ChildFailedError":
            # The report itself (every failed rank, its exit code and error) is what matters, not torchrun's frames.
            try:
                report = _short_tracebacks(str(exc))
            except Exception:
                report = str(exc)
            sys.stderr.write(f"{exc_type.__module__}.{name}: {report}\n")
        elif name == "SignalException":
            sys.stderr.write(f"torchrun stopped: {exc}\n")
        else:
            previous(exc_type, exc, tb)
        sys.stderr.flush()

    sys.excepthook = short_report


_TAIL_LOG_MODULE = "torch.distributed.elastic.multiprocessing.tail_log"
_TAIL_LOGFILE_PARAMETERS = ["header", "file", "dst", "finished", "interval_sec", "log_line_filter"]


def _tail_logfile(header, file, dst, finished, interval_sec, log_line_filter=None):
    """torch's ``tail_logfile`` (copy ``file`` to ``dst``, each line after ``header``, until ``finished`` is set and
    nothing is left to read), with two differences:

    - it waits on ``finished`` where torch's sleeps ``interval_sec``: once set, it wakes at once for its last read
      instead of finishing its sleep;
    - a line read before its end was written (``print(a, b)`` writes ``a``, the separator, ``b`` and the newline
      one by one under ``python -u``) is held one interval for the rest of it, so that it is copied as one line,
      not cut in two with a second header in the middle; a line still unfinished after that (a progress bar's
      ``\\r`` updates) is copied as it is, as torch's would.
    """
    while not os.path.exists(file):
        if finished.is_set():
            return
        finished.wait(interval_sec)

    def copy(text):
        if log_line_filter and log_line_filter(text):
            dst.write(f"{header}{text}")

    with open(file, errors="replace") as fp:
        held = ""  # the start of a line read one interval ago, before its end was written
        while True:
            line = fp.readline()
            if line and not line.endswith("\n") and not held and not finished.is_set():
                held = line
                finished.wait(interval_sec)
                continue
            if line or held:
                copy(held + line)
                held = ""
            elif finished.is_set():
                break
            else:
                finished.wait(interval_sec)


def _replace_tail_logfile(module):
    import inspect

    original = getattr(module, "tail_logfile", None)
    try:
        parameters = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        return
    if parameters == _TAIL_LOGFILE_PARAMETERS:  # the tailer this one stands in for; a changed one is left alone
        module.tail_logfile = _tail_logfile


class _AfterImport:
    """A meta path finder that lets module ``name`` load as it would, then calls ``then(module)``; once only, and
    only if that module is ever imported (torch is not imported for it)."""

    def __init__(self, name, then):
        self.name, self.then, self.used = name, then, False

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self.used:
            return None
        self.used = True  # before looking: the search below asks this finder too
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, then = loader.exec_module, self.then

        def exec_then(module):
            import contextlib

            exec_module(module)
            with contextlib.suppress(Exception):  # torch as it is
                then(module)

        loader.exec_module = exec_then  # this module's own loader instance
        return spec


def _load_shadowed_sitecustomize():
    """The ``sitecustomize`` later on the path, as Python would have loaded it without this one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    global SHADOWED
    SHADOWED = spec.origin
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # as site.py does for a failing sitecustomize
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")


class _DropWhenFull:
    """A text stream that swallows a full disk's ``ENOSPC`` (the output is dropped) and is otherwise the stream."""

    def __init__(self, stream):
        self._stream = stream
        self._dropped = 0

    def write(self, text):
        try:
            if self._dropped:  # room again: say once what is missing, where it is missing
                self._stream.write(f"[trainjob] {self._dropped} characters of output were dropped here: no space "
                                   "left on device for the log\n")
                self._dropped = 0
            return self._stream.write(text)
        except OSError as exc:
            if exc.errno != 28:  # ENOSPC
                raise
            self._dropped += len(text)
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except OSError as exc:
            if exc.errno != 28:
                raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _freeze_at_exit():
    """At exit, leave what the process built out of the interpreter's last garbage collections (``gc.freeze``
    after every other exit handler: registered first, it runs last). A process that imported torch spends about a
    quarter of a CPU-second at exit walking torch's objects, which go back to the system with the process anyway;
    on a node of 2 ranks that is the CPU of all three processes at once, at the end of every job. Exit handlers,
    the flushing of open files and objects freed as the modules are cleared run as before; only garbage kept
    alive by reference cycles is no longer finalized at exit."""
    import atexit
    import gc

    atexit.register(gc.freeze)


def _main():
    env = os.environ
    error_file = env.get("TORCHELASTIC_ERROR_FILE")
    if "LOCAL_RANK" in env:
        if error_file and _WORKER_MARK not in env:
            env[_WORKER_MARK] = str(os.getpid())  # the processes it starts inherit the mark and are left alone
            _install_worker_hook(error_file)
            _freeze_at_exit()
            if env.get("TRAINJOB_STACKS_DIR") and env.get("TRAINJOB_STACKS_SIGNAL"):
                _register_stack_dumps(env["TRAINJOB_STACKS_DIR"], env["TRAINJOB_STACKS_SIGNAL"])
                directory = env["TRAINJOB_STACKS_DIR"]
                _keep_flight_recorder_dumps(directory)
                rank = int(env.get("RANK", "0") or 0)
                sys.meta_path.insert(0, _AfterImport(
                    _C10D_MODULE, lambda _: _start_collectives_watch(_collectives_file(directory, rank))))
            if sys.stdout is not None and sys.stderr is not None:
                sys.stdout, sys.stderr = _DropWhenFull(sys.stdout), _DropWhenFull(sys.stderr)
    else:
        node_started()
    _load_shadowed_sitecustomize()


def pod_main():
    """What a training process of a Kubernetes pod gets, in an image with trainjob whose ``trainjob-site.pth``
    loads this module (:mod:`trainjob.pod_site`): its collectives reported to the operator, for the stall watch of
    a job that does not report progress, and its stacks in its log when they stop (:func:`_collectives_post`).
    The operator sets ``TRAINJOB_COLLECTIVES_URL`` next to the status endpoint's variables, a URL reference
    resolved against ``KUBEFLOW_TRAINER_SERVER_URL`` (its ``collectives`` is the job's endpoint beside ``status``)."""
    from urllib.parse import urljoin

    env = os.environ
    url, token, ca = (env.get("TRAINJOB_COLLECTIVES_URL"), env.get("KUBEFLOW_TRAINER_SERVER_TOKEN"),
                      env.get("KUBEFLOW_TRAINER_SERVER_CA_CERT"))
    stacks_after = _pod_stacks_after(env.get("TRAINJOB_STALL_DUMP") or "auto")  # the operator leaves auto out
    if "LOCAL_RANK" not in env or _WORKER_MARK in env or not url or not token or stacks_after is None:
        return
    url = urljoin(env.get("KUBEFLOW_TRAINER_SERVER_URL") or "", url)
    if not url.startswith(("https:", "http:")):
        sys.stderr.write(f"trainjob: TRAINJOB_COLLECTIVES_URL={env['TRAINJOB_COLLECTIVES_URL']!r} is no URL, even "
                         "against KUBEFLOW_TRAINER_SERVER_URL: the stall watch hears nothing from this rank\n")
        return
    if ca and not os.path.exists(ca):
        from trainjob.constants import STATUS_CA_CONFIGMAP  # noqa: PLC0415  (only when it is needed)

        sys.stderr.write(f"trainjob: the status endpoint's CA {ca} is missing (ConfigMap {STATUS_CA_CONFIGMAP} of "
                         "the job's namespace; the operator makes it when it starts): the stall watch hears nothing "
                         "from this rank\n")
        return
    env[_WORKER_MARK] = str(os.getpid())  # the processes it starts inherit the mark and are left alone
    publish = _collectives_post(url, token, ca, int(env.get("RANK", "0") or 0), stacks_after)
    sys.meta_path.insert(0, _AfterImport(_C10D_MODULE, lambda _: _start_collectives_watch(publish)))


def node_started():
    """What a node's torchrun gets: at its start, or when a warm torchrun, started before its node was known,
    becomes the node's (:mod:`trainjob.backends.local.node_keeper.warm_torchrun`, torch's tailer module already
    imported)."""
    env = os.environ
    if _NODE_MARK in env or "TRAINJOB_JOB_DIR" not in env or "LOCAL_RANK" in env:
        return
    env[_NODE_MARK] = str(os.getpid())
    _install_torchrun_hook()
    _freeze_at_exit()
    tail_log = sys.modules.get(_TAIL_LOG_MODULE)
    if tail_log is not None:
        import contextlib

        with contextlib.suppress(Exception):  # torch as it is
            _replace_tail_logfile(tail_log)
    else:
        sys.meta_path.insert(0, _AfterImport(_TAIL_LOG_MODULE, _replace_tail_logfile))


if __name__ == "sitecustomize":  # not when trainjob.pod_site loads this file for pod_main
    _main()
