"""Reading what torchrun reported: the rank prefix of log lines, the root cause among failed nodes."""

from __future__ import annotations

import pytest

from trainjob.backends.local.logs import NodeFailure, parse_line, pick_root_cause


@pytest.mark.parametrize(
    ("failures", "chosen"),
    [
        ([NodeFailure(0, 1, 0, 0, "2026-01-01_10:00:05"), NodeFailure(1, 1, 3, 1, "2026-01-01_10:00:01")], 1),
        ([NodeFailure(0, -15, 0, 0, "2026-01-01_10:00:01"), NodeFailure(1, 1, 2, 0, "2026-01-01_10:00:09")], 1),
        ([NodeFailure(1, 2), NodeFailure(0, 2)], 1),
    ],
)
def test_root_cause_prefers_real_errors_then_the_earliest(failures, chosen):
    assert pick_root_cause(failures).node == chosen


def test_rank_prefixes_are_parsed_from_node_logs():
    assert (parse_line(1, "[rank3]: loss 0.4").rank, parse_line(1, "[rank3]: loss 0.4").text) == (3, "loss 0.4")
    assert parse_line(0, "W1121 agent warning").rank is None


@pytest.mark.parametrize(
    ("failure", "text"),
    [
        (NodeFailure(1, 1, 3, 1, detail="ValueError: boom"), "node-1 rank 3 (local rank 1) exited with code 1: ValueError: boom"),
        (NodeFailure(0, -9), "node-0 was killed by SIGKILL"),
        (NodeFailure(2, 7), "node-2 exited with code 7"),
    ],
)
def test_failures_read_as_one_sentence(failure, text):
    assert failure.describe() == text
