"""Node logs with write times: merged by time across nodes, --tail, --since, --previous, stop lines folded."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainjob.backends.local import log_writer
from trainjob.backends.local.log_reader import read_logs
from trainjob.backends.local.log_writer import NodeLogWriter, note_stop_reason


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(log_writer.time, "time", clock)
    return clock


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    (tmp_path / "logs").mkdir()
    return tmp_path


def write(writer: NodeLogWriter, clock: Clock, when: float, text: str) -> None:
    clock.now = when
    writer.write(text.encode())


def texts(lines) -> list[str]:
    return [line.text for line in lines]


def two_nodes(job_dir: Path, clock: Clock) -> None:
    node0, node1 = NodeLogWriter(job_dir, 0, 1 << 20), NodeLogWriter(job_dir, 1, 1 << 20)
    write(node1, clock, 1001.0, "[rank1]: b1\n")
    write(node0, clock, 1002.0, "[rank0]: a2\n[rank0]: a2 again\n")
    write(node1, clock, 1003.0, "[rank1]: b3\n")
    write(node0, clock, 1004.0, "[rank0]: a4")  # no line break yet
    node0.close()
    node1.close()


def test_nodes_are_merged_by_the_time_their_lines_were_written(job_dir, clock):
    two_nodes(job_dir, clock)
    lines = list(read_logs(job_dir, [0, 1]))
    assert texts(lines) == ["b1", "a2", "a2 again", "b3", "a4"]
    assert [line.time for line in lines] == [1001.0, 1002.0, 1002.0, 1003.0, 1004.0]
    assert [line.node for line in lines] == [1, 0, 0, 1, 0]


def test_the_node_log_keeps_torchruns_output_as_written(job_dir, clock):
    two_nodes(job_dir, clock)
    assert (job_dir / "logs" / "node-0.log").read_text() == "[rank0]: a2\n[rank0]: a2 again\n[rank0]: a4"


def test_tail_is_the_last_lines_of_all_nodes_together(job_dir, clock):
    two_nodes(job_dir, clock)
    assert texts(read_logs(job_dir, [0, 1], tail=2)) == ["b3", "a4"]
    assert texts(read_logs(job_dir, [0, 1], tail=0)) == []
    assert texts(read_logs(job_dir, [0], tail=1)) == ["a4"]


def test_since_leaves_out_what_was_written_before(job_dir, clock):
    two_nodes(job_dir, clock)
    assert texts(read_logs(job_dir, [0, 1], since=1002.5)) == ["b3", "a4"]
    assert texts(read_logs(job_dir, [0, 1], since=1003.0, rank=0)) == ["a4"]


def test_times_follow_a_rotation(job_dir, clock):
    writer = NodeLogWriter(job_dir, 0, max_bytes=64 * 1024)
    for i in range(3000):
        write(writer, clock, 2000.0 + i, f"[rank0]: {i:040d}\n")
    writer.close()
    assert (job_dir / "logs" / "node-0.log.1.times").exists()
    lines = list(read_logs(job_dir, [0]))
    kept = [(int(line.text), line.time) for line in lines if line.rank == 0]
    assert kept and all(when == 2000.0 + i for i, when in kept)
    assert texts(read_logs(job_dir, [0], since=2000.0 + 2998)) == [f"{2998:040d}", f"{2999:040d}"]


def test_a_new_attempt_keeps_the_previous_one_for_previous(job_dir, clock):
    first = NodeLogWriter(job_dir, 0, 1 << 20)
    write(first, clock, 1001.0, "[rank0]: attempt one\n")
    first.close()
    second = NodeLogWriter(job_dir, 0, 1 << 20)
    write(second, clock, 1010.0, "[rank0]: attempt two\n")
    second.close()

    assert texts(read_logs(job_dir, [0], previous=True)) == ["attempt one"]
    current = texts(read_logs(job_dir, [0]))
    assert current[-1] == "attempt two" and "attempt one" not in current
    assert current[0].startswith("[trainjob] node-0: attempt started")


def test_output_after_a_requested_stop_is_folded_into_one_line(job_dir, clock):
    writer = NodeLogWriter(job_dir, 0, 1 << 20)
    write(writer, clock, 1001.0, "[rank0]: step 1\n")
    note_stop_reason(job_dir, "the job was suspended")
    clock.now = 1002.0
    writer.mark_stop()
    write(writer, clock, 1002.5, "W1123 agent: Received 15 death signal, shutting down workers\n"
                                 "[rank0]: Traceback (most recent call last):\n[rank0]: KeyboardInterrupt\n")
    writer.close()

    shown = texts(read_logs(job_dir, [0]))
    assert shown[:2] == ["step 1", "[trainjob] node-0 stopping: the job was suspended"]
    assert shown[2].startswith("[trainjob: 3 line(s) of shutdown output after the stop are hidden")
    assert not any("Traceback" in text for text in shown)
    assert texts(read_logs(job_dir, [0], rank=0))[-1].startswith("[trainjob: 3 line(s)")
    everything = texts(read_logs(job_dir, [0], stop_output=True))
    assert "Traceback (most recent call last):" in everything and len(everything) == 5


def test_output_of_the_next_attempt_is_shown_again(job_dir, clock):
    writer = NodeLogWriter(job_dir, 0, 1 << 20)
    writer.mark_stop()
    writer.write(b"teardown\n")
    writer.close()
    again = NodeLogWriter(job_dir, 0, 1 << 20)
    again.write(b"[rank0]: resumed\n")
    again.close()
    assert texts(read_logs(job_dir, [0]))[-1] == "resumed"
    previous = texts(read_logs(job_dir, [0], previous=True))
    assert previous[0] == "[trainjob] node-0 stopping: stop requested" and previous[1].startswith("[trainjob: 1 line")
