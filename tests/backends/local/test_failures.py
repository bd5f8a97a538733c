"""Reading what torchrun and the node keepers reported: rank prefixes, every failure, the one that came first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainjob.backends.local.log_reader import parse_line
from trainjob.backends.local.supervisor.failures import NodeExit, NodeFailure, node_failures, pick_root_cause

# torchrun's report when rank 3 was SIGKILLed and it then stopped rank 2: both stamped to the same second, and
# torchrun calls the lower local rank the root cause.
TORCHRUN_REPORT = """\
[rank2]: RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:29500
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-01-01_10:00:05
  host      : box
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 4003)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4003
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_10:00:05
  host      : box
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 4002)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4002
============================================================
"""


@pytest.mark.parametrize(
    ("failures", "chosen"),
    [
        ([NodeFailure(0, 1, 0, 0, 105.0), NodeFailure(1, 1, 3, 1, 101.0)], 1),
        # a death by signal is a cause like any other: the OOM killer sends SIGKILL
        ([NodeFailure(0, 1, 0, 0, 100.9), NodeFailure(1, -9, 2, 0, 100.2)], 1),
        # at the same moment, torchrun's SIGTERM of the ranks left is the consequence
        ([NodeFailure(0, -15, 0, 0, 100.0), NodeFailure(0, -9, 1, 1, 100.0)], 1),
        ([NodeFailure(1, 2, time=None), NodeFailure(0, 2, time=7.0)], 1),
        ([NodeFailure(1, 2), NodeFailure(0, 2)], 0),
    ],
)
def test_root_cause_is_the_failure_that_happened_first(failures, chosen):
    assert pick_root_cause(failures) is failures[chosen]


def test_every_reported_rank_is_timed_by_when_its_keeper_saw_it_end(tmp_path: Path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node-1.log").write_text(TORCHRUN_REPORT)
    ended = NodeExit(code=1, time=106.0, ranks=[{"pid": 4002, "rank": 2, "local_rank": 0, "time": 100.31},
                                                {"pid": 4003, "rank": 3, "local_rank": 1, "time": 100.12}])

    failures = node_failures(tmp_path, 1, ended, 1)

    assert sorted((f.rank, f.exit_code, f.time) for f in failures) == [(2, -15, 100.31), (3, -9, 100.12)]
    assert pick_root_cause(failures).describe() == "node-1 rank 3 (local rank 1) was killed by SIGKILL"


def test_a_report_from_an_earlier_attempt_is_not_this_attempts_failure(tmp_path: Path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node-0.log").write_text(TORCHRUN_REPORT + "[rank2]: ValueError: bad batch\n")
    ended = NodeExit(code=1, time=200.0, ranks=[{"pid": 5002, "rank": 2, "local_rank": 0, "time": 199.0}])

    (failure,) = node_failures(tmp_path, 0, ended, 1)

    assert (failure.rank, failure.exit_code, failure.exception) == (None, 1, "ValueError: bad batch")


def test_reported_ranks_their_keeper_never_saw_are_still_this_attempts_failures(tmp_path: Path):
    """A rank that raises as it starts can end between two of the keeper's looks; the keeper saw only a rank that
    finished well (torchrun does not report it)."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node-1.log").write_text(TORCHRUN_REPORT)
    ended = NodeExit(code=1, time=106.0, ranks=[{"pid": 4004, "rank": 4, "local_rank": 2, "time": 100.05}])

    failures = node_failures(tmp_path, 1, ended, 1)

    assert sorted((f.rank, f.pid, f.exit_code) for f in failures) == [(2, 4002, -15), (3, 4003, -9)]


def test_a_node_whose_keeper_was_killed_says_so(tmp_path: Path):
    lost = NodeExit(code=-9, time=50.0, ranks=[], lost=True)
    (failure,) = node_failures(tmp_path, 2, lost, -9)
    assert failure.describe() == "node-2 was killed by SIGKILL: its keeper was killed before it recorded how the node ended"


def test_exit_records_are_read_back(tmp_path: Path):
    path = tmp_path / "node-0.exit.json"
    path.write_text(json.dumps({"code": -9, "time": 3.5, "ranks": [{"pid": 1, "rank": 0, "local_rank": 0, "time": 3.0}]}))
    assert NodeExit.read(path) == NodeExit(code=-9, time=3.5, ranks=[{"pid": 1, "rank": 0, "local_rank": 0, "time": 3.0}])
    assert NodeExit.read(tmp_path / "missing.json") is None


def test_rank_prefixes_are_parsed_from_node_logs():
    assert (parse_line(1, "[rank3]: loss 0.4").rank, parse_line(1, "[rank3]: loss 0.4").text) == (3, "loss 0.4")
    assert parse_line(0, "W1121 agent warning").rank is None


@pytest.mark.parametrize(
    ("failure", "text"),
    [
        (NodeFailure(1, 1, 3, 1, exception="ValueError: boom"), "node-1 rank 3: ValueError: boom"),
        (NodeFailure(1, 1, exception="ValueError: boom"), "node-1: ValueError: boom"),
        # a rank killed by a signal did not die of the exception it may have printed (and handled) before
        (NodeFailure(1, -9, 3, 1, exception="ValueError: boom"), "node-1 rank 3 (local rank 1) was killed by SIGKILL"),
        (NodeFailure(1, 1, 3, 1), "node-1 rank 3 (local rank 1) exited with code 1"),
        (NodeFailure(0, -9), "node-0 was killed by SIGKILL"),
        (NodeFailure(2, 7), "node-2 exited with code 7"),
    ],
)
def test_failures_read_as_one_sentence(failure, text):
    assert failure.describe() == text


# What torchrun prints when rank 1 (node 1) raised after init_process_group: torch prefixes the traceback with
# "[rank1]: " itself, torchrun's tee adds its own, and the report names no error file.
RAISED_AFTER_INIT = """\
[rank1]: [rank1]: Traceback (most recent call last):
[rank1]: [rank1]:   File "/tmp/bad.py", line 5, in <module>
[rank1]: [rank1]:     print(lr)
[rank1]: [rank1]: NameError: name 'lr' is not defined
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_10:00:05
  host      : box
  rank      : 1 (local_rank: 0)
  exitcode  : 1 (pid: 5001)
  error_file: {error_file}
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def _node_log(tmp_path: Path, node: int, text: str) -> None:
    (tmp_path / "logs").mkdir(exist_ok=True)
    (tmp_path / "logs" / f"node-{node}.log").write_text(text)


def test_the_exception_is_found_behind_torchs_own_rank_prefix(tmp_path: Path):
    _node_log(tmp_path, 1, RAISED_AFTER_INIT.format(error_file="<N/A>"))
    ended = NodeExit(code=1, time=106.0, ranks=[{"pid": 5001, "rank": 1, "local_rank": 0, "time": 100.5}])

    (failure,) = node_failures(tmp_path, 1, ended, 1)

    assert failure.describe() == "node-1 rank 1: NameError: name 'lr' is not defined"


def test_the_error_file_names_the_exception_even_when_the_rank_printed_none(tmp_path: Path):
    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": {
        "message": "RuntimeError: Error(s) in loading state_dict for Net:\n\tMissing key(s): fc.weight",
        "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1767261605"},
    }}))
    report = RAISED_AFTER_INIT.format(error_file=error_file)
    _node_log(tmp_path, 1, report[report.index("torch.distributed"):])  # the rank's own output is lost

    (failure,) = node_failures(tmp_path, 1, NodeExit(code=1, time=106.0, ranks=[]), 1)

    assert failure.describe() == "node-1 rank 1: RuntimeError: Error(s) in loading state_dict for Net:"


def test_a_peer_that_lost_its_connection_names_no_exception(tmp_path: Path):
    _node_log(tmp_path, 0, TORCHRUN_REPORT)
    ended = NodeExit(code=1, time=106.0, ranks=[{"pid": 4002, "rank": 2, "local_rank": 0, "time": 100.31},
                                                {"pid": 4003, "rank": 3, "local_rank": 1, "time": 100.12}])

    failures = {f.rank: f for f in node_failures(tmp_path, 0, ended, 1)}

    assert failures[2].exception is None, "'Connection closed by peer' is a consequence, not a cause"


# torchrun's own exit when the rendezvous closed before its node joined: no rank ran, so no report of failures.
AGENT_RENDEZVOUS_CLOSED = """\
[W1129 10:00:04.000000000 socket.cpp:200] [c10d] The client socket has timed out
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "torch/distributed/elastic/rendezvous/dynamic_rendezvous.py", line 1150, in next_rendezvous
    self._op_executor.run(join_op, deadline, self._get_deadline)
torch.distributed.elastic.rendezvous.api.RendezvousClosedError
"""


def test_a_node_whose_torchrun_failed_says_what_it_saw(tmp_path: Path):
    """A node that ran no rank and raised nothing of its own still says why it stopped: the rendezvous had
    closed. It is a consequence, so it is the failure's detail, never its exception."""
    _node_log(tmp_path, 1, AGENT_RENDEZVOUS_CLOSED)

    (failure,) = node_failures(tmp_path, 1, NodeExit(code=1, time=106.0, ranks=[]), 1)

    assert failure.exception is None
    assert failure.describe() == (
        "node-1 exited with code 1: torch.distributed.elastic.rendezvous.api.RendezvousClosedError")


def test_torchruns_own_error_file_is_read_when_its_output_says_nothing(tmp_path: Path):
    _node_log(tmp_path, 1, "starting\n")
    agent_file = tmp_path / "logs" / "node-1.error.json"
    agent_file.write_text(json.dumps({"message": {"message": "RendezvousTimeoutError: no quorum in 600 s",
                                                  "extraInfo": {"timestamp": "0"}}}))
    written = agent_file.stat().st_mtime

    (failure,) = node_failures(tmp_path, 1, NodeExit(code=1, time=written + 1, ranks=[]), 1)
    assert failure.describe() == "node-1 exited with code 1: RendezvousTimeoutError: no quorum in 600 s"

    # one an earlier attempt left says nothing about this one
    (failure,) = node_failures(tmp_path, 1, NodeExit(code=1, time=written + 60, ranks=[]), 1)
    assert failure.describe() == "node-1 exited with code 1"


# what a rank of node-1 wrote to its error file when its peer on node-0 was SIGKILLed mid all-reduce
PEER_DIED = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:587] Read error "
             "[127.0.0.1]:41102: EOF. This is typically caused by a remote worker crashing. Check the logs of the "
             "remote worker before reporting an error. GLHF!")
# torchrun's report for it: RAISED_AFTER_INIT's, for rank 3 (local rank 1), without the rank's own output
PEER_REPORT = (RAISED_AFTER_INIT[RAISED_AFTER_INIT.index("torch.distributed"):]
               .replace("rank      : 1 (local_rank: 0)", "rank      : 3 (local_rank: 1)").replace("5001", "6003"))


def test_a_killed_rank_seen_late_is_still_the_cause_not_the_peer_that_lost_it(tmp_path: Path):
    """On a busy machine node-0's keeper can see its rank die after node-1's rank has already failed of the lost
    connection: the peer's error (its error file says a remote worker crashed) is never the root cause."""
    _node_log(tmp_path, 0, TORCHRUN_REPORT.replace("rank      : 3", "rank      : 1").replace("rank      : 2", "rank      : 0"))
    error_file = tmp_path / "rank3.error.json"
    error_file.write_text(json.dumps({"message": {"message": PEER_DIED, "extraInfo": {"timestamp": "0"}}}))
    _node_log(tmp_path, 1, PEER_REPORT.format(error_file=error_file))
    node0 = NodeExit(code=1, time=101.0, ranks=[{"pid": 4002, "rank": 0, "local_rank": 0, "time": 100.9},
                                                {"pid": 4003, "rank": 1, "local_rank": 1, "time": 100.8}])
    node1 = NodeExit(code=1, time=100.7, ranks=[{"pid": 6003, "rank": 3, "local_rank": 1, "time": 100.5}])

    failures = node_failures(tmp_path, 0, node0, 1) + node_failures(tmp_path, 1, node1, 1)

    (peer,) = [f for f in failures if f.rank == 3]
    assert peer.consequence and peer.exception is None
    assert peer.describe() == f"node-1 rank 3 (local rank 1) exited with code 1: {PEER_DIED[:500]}"
    assert pick_root_cause(failures).describe() == "node-0 rank 1 (local rank 1) was killed by SIGKILL"
    # alone, the peer's failure is what is known, and says what it saw
    assert pick_root_cause(node_failures(tmp_path, 1, node1, 1)) == peer
