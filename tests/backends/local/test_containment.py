"""Nothing of a job outlives it, and its logs stay within their cap on disk and in the memory of readers."""

from __future__ import annotations

import contextlib
import tracemalloc
from pathlib import Path

import psutil
import pytest
from jobtest.local import trainjob_resource, wait_until

from trainjob.backends.local.log_reader import read_logs
from trainjob.backends.local.log_writer import LOG_MAX_BYTES_ENV, NodeLogWriter

# Leaves a daemon behind: double-forked, in a session of its own, with an empty environment (so no job marker).
DAEMONIZE = """
    import os, subprocess, sys, time
    job_dir = os.environ["TRAINJOB_JOB_DIR"]
    if os.fork() == 0:
        os.setsid()
        daemon = subprocess.Popen(["sleep", "600"], env={}, start_new_session=True)
        with open(os.path.join(job_dir, "daemon"), "w") as f:
            f.write(str(daemon.pid))
        os._exit(0)
    while not os.path.exists(os.path.join(job_dir, "daemon")):
        time.sleep(0.01)
    if sys.argv[1] == "stay":
        time.sleep(600)
"""


@pytest.fixture
def daemons():
    """Pids of daemons a test's job left; whatever is still alive at the end is killed (and the test failed)."""
    found: list[psutil.Process] = []
    yield found
    for process in found:
        with contextlib.suppress(psutil.Error):
            process.kill()


def daemon_of(job_dir: Path) -> psutil.Process:
    return psutil.Process(int(wait_until(lambda: (job_dir / "daemon").exists() and (job_dir / "daemon").read_text(),
                                         timeout=120)))


def test_what_a_training_process_leaves_in_the_background_ends_with_the_job(backend, script, daemons):
    daemonize = script("daemonize.py", DAEMONIZE)
    backend.apply(trainjob_resource("tidy", ["torchrun", daemonize, "leave"], num_proc_per_node=1))
    daemons.append(daemon_of(backend.store.job_dir("tidy")))

    assert backend.wait_for_job_status("tidy", timeout=120).status == "Complete"

    assert not daemons[0].is_running()


def test_delete_stops_a_background_process_that_cleared_its_environment(backend, script, daemons):
    daemonize = script("daemonize.py", DAEMONIZE)
    backend.apply(trainjob_resource("sneaky", ["python", daemonize, "stay"]))
    daemons.append(daemon_of(backend.store.job_dir("sneaky")))
    assert "TRAINJOB_JOB_DIR" not in daemons[0].environ()

    backend.delete_job("sneaky")

    assert not daemons[0].is_running()


def disk_usage(directory: Path) -> int:
    """Bytes the files under ``directory`` take on disk; a file rotated away while it is counted counts 0."""
    total = 0
    for path in directory.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            if path.is_file():
                total += path.stat().st_blocks * 512
    return total


def contents(path: Path) -> bytes:
    """The bytes of a log that the keeper may be rotating at this moment (then it is briefly absent)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def test_node_logs_are_capped_and_torchruns_copies_do_not_double_them(backend, script, monkeypatch):
    cap = 256 * 1024
    monkeypatch.setenv(LOG_MAX_BYTES_ENV, str(cap))
    chatty = script("chatty.py", """
        import os, sys, time
        for i in range(40000):
            sys.stdout.write(f"line {i:06d} " + "x" * 88 + "\\n")
        sys.stdout.flush()
        while not os.path.exists(os.path.join(os.environ["TRAINJOB_JOB_DIR"], "finish")):
            time.sleep(0.05)
    """)
    backend.apply(trainjob_resource("chatty", ["torchrun", chatty], num_proc_per_node=1))
    job_dir = backend.store.job_dir("chatty")
    logs = job_dir / "logs"

    last = logs / "node-0.log"
    wait_until(lambda: b"line 039999" in contents(last), timeout=120, what="the last line in node-0.log")
    wait_until(lambda: disk_usage(logs) < 4 * cap, timeout=15, what="4 MB of output stored once and capped")
    (job_dir / "finish").touch()
    assert backend.wait_for_job_status("chatty", timeout=120).status == "Complete"

    assert all(path.stat().st_size < 2 * cap for path in logs.glob("node-0.log*") if path.suffix != ".dropped")
    assert disk_usage(logs) < 4 * cap
    lines = [line.text for line in backend.logs("chatty")]
    assert lines[0].startswith("[trainjob: ") and lines[0].endswith(" bytes of earlier output dropped]")
    numbered = [int(text.split()[1]) for text in lines if text.startswith("line ")]
    assert numbered == list(range(numbered[0], 40000)), "what is kept is the end of the output, in order"


def test_reading_a_large_log_takes_bounded_memory(tmp_path: Path):
    (tmp_path / "logs").mkdir()
    line = b"[rank0]: " + b"y" * 90 + b"\n"
    with (tmp_path / "logs" / "node-0.log").open("wb") as f:
        for _ in range(24):
            f.write(line * (1024 * 1024 // len(line)))
    tracemalloc.start()
    try:
        count = sum(1 for _ in read_logs(tmp_path, [0]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 24 * (1024 * 1024 // len(line))
    assert peak < 8 * 1024 * 1024, f"{peak / 2**20:.1f} MiB to read a 24 MiB log"


def test_a_follower_keeps_every_line_across_rotations(tmp_path: Path):
    (tmp_path / "logs").mkdir()
    writer = NodeLogWriter(tmp_path, 0, max_bytes=64 * 1024)
    written = iter(range(30000))
    done = False

    def write_some() -> bool:
        nonlocal done
        for _ in range(500):
            i = next(written, None)
            if i is None:
                done = True
                break
            writer.write(f"[rank0]: {i}\n".encode())
        return done

    follower = read_logs(tmp_path, [0], follow=True, finished=write_some, poll_interval=0)
    seen = [int(line.text) for line in follower if line.rank == 0]
    writer.close()
    assert seen == list(range(30000))
    assert (tmp_path / "logs" / "node-0.log.dropped").exists()
