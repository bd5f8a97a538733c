"""The sitecustomize every Python process of a local node loads: error files for ranks, short torchrun reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from trainjob.backends.local.worker_site import SITE_DIR


def run_python(code: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINJOB_", "TORCHELASTIC_", "LOCAL_RANK"))}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**clean, "PYTHONPATH": SITE_DIR, **env},
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
