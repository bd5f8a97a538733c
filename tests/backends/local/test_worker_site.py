"""The sitecustomize every Python process of a local node loads: error files for ranks, short torchrun reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from trainjob.backends.local.worker_site import SITE_DIR


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("TRAINJOB_", "TORCHELASTIC_", "LOCAL_RANK"))}


def run_python(code: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**_clean_env(), "PYTHONPATH": SITE_DIR, **env},
    )


def test_a_rank_that_raises_writes_its_torchelastic_error_file(subprocesses, tmp_path: Path):
    error_file = tmp_path / "error.json"

    done = run_python("print(lr)", {"LOCAL_RANK": "0", "TORCHELASTIC_ERROR_FILE": str(error_file)}, tmp_path)

    assert done.returncode == 1 and "NameError: name 'lr' is not defined" in done.stderr  # still printed
    message = json.loads(error_file.read_text())["message"]
    assert message["message"] == "NameError: name 'lr' is not defined"
    assert "NameError" in message["extraInfo"]["py_callstack"]


def test_a_scripts_own_record_and_the_processes_a_rank_starts_are_left_alone(subprocesses, tmp_path: Path):
    error_file = tmp_path / "error.json"
    error_file.write_text('{"message": "written by @record"}')
    env = {"LOCAL_RANK": "0", "TORCHELASTIC_ERROR_FILE": str(error_file)}

    run_python("raise ValueError('late')", env, tmp_path)
    assert json.loads(error_file.read_text())["message"] == "written by @record"

    error_file.unlink()
    child = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'raise KeyError(1)'])"
    done = run_python(child, env, tmp_path)
    assert done.returncode == 0 and "KeyError" in done.stderr
    assert not error_file.exists(), "a data loader worker's or subprocess's exception is not the rank's"


def test_the_sitecustomize_it_shadows_still_runs(subprocesses, tmp_path: Path):
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_SITE_RAN'] = '1'\n")

    done = run_python("import os; print(os.environ.get('SHADOWED_SITE_RAN'))",
                      {"PYTHONPATH": os.pathsep.join([SITE_DIR, str(other)])}, tmp_path)

    assert done.stdout.strip() == "1", done.stderr


#: Garbage in a reference cycle, made just before exit: the interpreter's last collection finalizes it, unless
#: what the process built was frozen out of it (``gc.freeze``). Its ``__del__`` writes through a bound ``os.write``
#: (the modules may be cleared by then). A handler the script registers runs before the freeze, and sees none.
CYCLE_AT_EXIT = """
import atexit, gc, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
atexit.register(lambda: os.write(fd, b"handler ran, frozen=%d\\n" % gc.get_freeze_count()))
class Cycle:
    def __init__(self):
        self.me = self
    def __del__(self, write=os.write, fd=fd):
        write(fd, b"cycle finalized\\n")
Cycle()
"""


def test_ranks_and_the_nodes_torchrun_skip_the_last_garbage_collection_at_exit(subprocesses, tmp_path: Path):
    """Walking torch's objects at exit costs a torch process ~0.25 CPU-s; a rank and its node's torchrun freeze
    them instead, after every other exit handler. A process the rank starts, and one outside a node, collect."""
    script = tmp_path / "cycle.py"
    script.write_text(CYCLE_AT_EXIT)
    rank = {"LOCAL_RANK": "0", "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")}
    roles = {"rank": rank, "node": {"TRAINJOB_JOB_DIR": str(tmp_path)}, "outside": {}}
    for role, env in roles.items():
        done = subprocess.run([sys.executable, str(script), str(tmp_path / role)], cwd=tmp_path, timeout=60,
                              env={**_clean_env(), "PYTHONPATH": SITE_DIR, **env}, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    child = f"import subprocess, sys; subprocess.run([sys.executable, {str(script)!r}, {str(tmp_path / 'child')!r}])"
    assert run_python(child, rank, tmp_path).returncode == 0

    said = {role: (tmp_path / role).read_text().splitlines() for role in ("rank", "node", "outside", "child")}
    assert said["rank"] == said["node"] == ["handler ran, frozen=0"]
    assert said["outside"] == said["child"] == ["handler ran, frozen=0", "cycle finalized"]


TORCHRUN_FAILURE = '''
class ChildFailedError(Exception):
    pass

ChildFailedError.__module__ = "torch.distributed.elastic.multiprocessing.errors"
REPORT = """
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_12:04:50
  host      : localhost
  rank      : 1 (local_rank: 0)
  exitcode  : 1 (pid: 23127)
  error_file: /tmp/error.json
  traceback : Traceback (most recent call last):
    File "/tmp/train.py", line 5, in <module>
      print(lr)
  NameError: name 'lr' is not defined

============================================================"""

def launch_agent():
    raise ChildFailedError(REPORT)

launch_agent()
'''


def test_torchruns_failure_report_is_printed_without_its_own_traceback(subprocesses, tmp_path: Path):
    done = run_python(TORCHRUN_FAILURE, {"TRAINJOB_JOB_DIR": str(tmp_path)}, tmp_path)

    lines = done.stderr.splitlines()
    assert done.returncode == 1
    assert "Traceback (most recent call last):" not in done.stderr and "launch_agent" not in done.stderr
    assert lines[0] == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "
    assert "  traceback : NameError: name 'lr' is not defined" in lines
    assert "  error_file: /tmp/error.json" in lines  # what the supervisor reads of the report is kept


def test_torchrun_stopped_by_a_signal_says_so_in_one_line(subprocesses, tmp_path: Path):
    code = """
        class SignalException(Exception):
            pass
        raise SignalException("Process 17 got signal: 15")
    """
    done = run_python(code, {"TRAINJOB_JOB_DIR": str(tmp_path)}, tmp_path)

    assert done.stderr.strip() == "torchrun stopped: Process 17 got signal: 15"


TAILER_STOPPED = """
    import sys, threading
    print("torch imported at start-up:", "torch" in sys.modules)
    from torch.distributed.elastic.multiprocessing import tail_log

    print("tailer:", tail_log.tail_logfile.__module__)
    log = open("rank.log", "w", buffering=1)
    log.write("before\\n")
    copied, finished = [], threading.Event()
    class Copy:
        def write(self, text):
            copied.append(text)
    every_line = lambda line: True
    args = ("[r0]:", "rank.log", Copy(), finished, 3600.0, every_line)  # as torchrun's TailLog passes them
    tailer = threading.Thread(target=tail_log.tail_logfile, args=args)
    tailer.start()
    log.write("after\\n")
    log.close()
    finished.set()  # an hour's interval: torch's own tailer would sleep it out before its last read
    tailer.join(timeout=30)
    print("stopped:", not tailer.is_alive())
    print("copied:", copied)
    sys.stdout.flush()
    import os; os._exit(0)  # a tailer still asleep would hold the interpreter's exit
"""


def test_torchruns_tailers_end_when_stopped_with_every_line_copied(subprocesses, tmp_path: Path):
    """torchrun tees each rank through tailers that sleep between reads; at a node's end they must wake for their
    last read at once, not after their sleep, and lose no line."""
    done = run_python(TAILER_STOPPED, {"TRAINJOB_JOB_DIR": str(tmp_path)}, tmp_path)

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "torch imported at start-up: False",  # the node's sitecustomize waits for torchrun to import it
        "tailer: sitecustomize",
        "stopped: True",
        "copied: ['[r0]:before\\n', '[r0]:after\\n']",
    ], done.stderr[-3000:]


TAILER_PIECES = """
    import os, sys, threading, time
    from torch.distributed.elastic.multiprocessing import tail_log

    log = os.open("rank.log", os.O_WRONLY | os.O_CREAT)
    write = lambda text: os.write(log, text.encode())  # as python -u does: each piece at once
    copied, finished = [], threading.Event()
    class Copy:
        def write(self, text):
            copied.append(text)
    args = ("[r0]:", "rank.log", Copy(), finished, 0.5, lambda line: True)
    tailer = threading.Thread(target=tail_log.tail_logfile, args=args)
    tailer.start()
    time.sleep(0.2)
    write("'a b'")  # print("'a b'", 42, sep="|") under python -u: three writes
    time.sleep(0.3)  # the tailer has read the first piece by now
    write("|42")
    write("\\n")
    write("loading ...")  # a line the rank ends much later: what there is shows meanwhile
    time.sleep(2.0)
    print("unfinished line copied meanwhile:", copied[-1:] == ["[r0]:loading ..."])
    write("done\\n")
    os.close(log)
    finished.set()
    tailer.join(timeout=30)
    print("copied:", copied)
    sys.stdout.flush()
    os._exit(0)
"""


def test_a_line_written_in_pieces_is_copied_as_one_line(subprocesses, tmp_path: Path):
    """A rank's ``print`` writes its arguments one by one; the tailer must not cut the line where it happened to
    read, leaving a second rank header in the middle of it; a line that stays unfinished for long still shows
    while the rank runs (its end then follows under a header of its own, as with torch's tailer)."""
    done = run_python(TAILER_PIECES, {"TRAINJOB_JOB_DIR": str(tmp_path)}, tmp_path)

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "unfinished line copied meanwhile: True",
        "copied: [\"[r0]:'a b'|42\\n\", '[r0]:loading ...', '[r0]:done\\n']",
    ], done.stderr[-3000:]


def test_a_ranks_tailer_is_torchs_own(subprocesses, tmp_path: Path):
    """Only the node's torchrun gets the tailer: a training process imports torch as it is."""
    code = "from torch.distributed.elastic.multiprocessing import tail_log; print(tail_log.tail_logfile.__module__)"
    done = run_python(code, {"TRAINJOB_JOB_DIR": str(tmp_path), "LOCAL_RANK": "0"}, tmp_path)

    assert done.stdout.strip() == "torch.distributed.elastic.multiprocessing.tail_log", done.stderr[-3000:]
