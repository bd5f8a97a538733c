"""A rank's own stacks thread (what a Kubernetes job's ranks run): silent past its limit, it writes every thread's
stack to stderr once, prefixed with its rank, in the form the operator reads back (``stacks_in_log``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from jobtest.tiers import starts

from trainjob.backends.stacks import RankStacks, find_stuck_ranks
from trainjob.log_stacks import stacks_in_log

SCRIPT = """
import time
import trainjob.torch as tt

def stuck_here():
    time.sleep(4)

for step in range(3):
    tt.report({"loss": 1.0}, step=step)
stuck_here()
tt.report({"loss": 0.5}, step=3)
time.sleep(2.5)
"""


@pytest.fixture
@starts("procs")
def rank() -> Callable[[dict[str, str]], subprocess.CompletedProcess[str]]:
    """Run ``script`` (SCRIPT) as a rank with ``env`` and ``args``."""

    def run(env: dict[str, str], script: str = SCRIPT, *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-c", script, *args], env={"PATH": "/usr/bin:/bin", **env},
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    return run


def test_a_silent_rank_writes_its_stacks_once_and_again_after_a_new_report(rank) -> None:
    proc = rank({"RANK": "1", "TRAINJOB_STALL_DUMP": "1.5"})
    assert proc.stderr.count("[trainjob-stacks rank 1] no progress for ") == 2, proc.stderr  # once per silence
    dumps = stacks_in_log(proc.stderr)
    assert list(dumps) == [1]
    # the latest dump: after the last report, in the final sleep of the script itself
    found = find_stuck_ranks([RankStacks(1, dumps[1])])
    assert found.stuck == [1] and "<module> (<string>:12)" in found.summary, (found, dumps[1])
    assert '[trainjob-stacks rank 1]   File "<string>", line 6 in stuck_here' in proc.stderr  # the first silence


def test_no_watchdog_unless_the_operator_asks(rank) -> None:
    assert "trainjob-stacks" not in rank({"RANK": "0"}).stderr


def test_a_pod_with_the_status_client_and_no_setting_dumps_at_auto(rank) -> None:
    """The operator leaves ``TRAINJOB_STALL_DUMP=auto`` out of pods with its status client: a rank there watches
    itself as with ``auto`` (so none dumps within the floor's 30 s here), and ``off`` still turns it off."""
    script = ("import trainjob.torch as tt\nfrom trainjob.torch import rank_stacks\ntt.report({'loss': 1.0}, step=1)\n"
              "print(rank_stacks._watchdog is not None and rank_stacks._watchdog.setting)\n")
    pod = {"RANK": "0", "TRAINJOB_COLLECTIVES_URL": "collectives"}
    assert rank(pod, script).stdout.splitlines()[-1] == "auto"
    assert rank({**pod, "TRAINJOB_STALL_DUMP": "off"}, script).stdout.splitlines()[-1] == "False"
    assert rank({"RANK": "0"}, script).stdout.splitlines()[-1] == "False"


ASKED = """
import sys, time
from pathlib import Path
import trainjob.torch as tt

request = Path(sys.argv[1])

def waiting_here():
    time.sleep(3)

tt.report({"loss": 1.0}, step=1)  # starts the stacks thread, which takes the file's value as answered already
request.write_text("222")  # what `trainjob stacks` asks through the pod's annotation
waiting_here()
"""


def test_a_rank_answers_each_new_stacks_request_once_not_an_old_one(rank, tmp_path) -> None:
    """``trainjob stacks`` on Kubernetes: the kubelet writes the pod's ``trainjob/stacks-request`` annotation into
    the status-client volume next to the token; a new value there makes the rank write its stacks, headed by it."""
    (tmp_path / "token").write_text("t")
    request = tmp_path / "stacks-request"
    request.write_text("111")  # asked long before this rank started: meant for the ranks before it
    os.utime(request, (time.time() - 600, time.time() - 600))
    proc = rank({"RANK": "3", "KUBEFLOW_TRAINER_SERVER_TOKEN": str(tmp_path / "token")}, ASKED, str(request))
    assert proc.stderr.count("[trainjob-stacks rank 3] stacks on request ") == 1, proc.stderr
    assert stacks_in_log(proc.stderr, request="111") == {}
    answered = stacks_in_log(proc.stderr, request="222")
    found = find_stuck_ranks([RankStacks(3, answered[3])])
    assert "waiting_here (<string>:9)" in found.summary, (found, answered)
