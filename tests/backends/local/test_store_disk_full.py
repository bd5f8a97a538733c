"""The local store on a full disk (a real tmpfs the test mounts as ``$TRAINJOB_HOME``): a command that cannot write
says so plainly and keeps nothing of itself, and once space is freed the store is intact and holds what it held."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from jobtest.filesystems import fill, small_tmpfs

from trainjob.cli.main import cli
from trainjob.sdk import types


@pytest.fixture
def small_home(trainjob_home: Path) -> Iterator[Path]:
    """``$TRAINJOB_HOME`` on an 8 MiB tmpfs, mounted before anything is written there."""
    with small_tmpfs(trainjob_home, 8 << 20) as mounted:
        yield mounted


def test_a_full_disk_under_the_store_is_an_error_that_keeps_the_store_intact(
    small_home: Path, local_jobs: Any, tmp_path: Path
) -> None:
    script = tmp_path / "hello.py"
    script.write_text("print('hello', flush=True)\n")
    first = CliRunner().invoke(cli, ["run", "--name", "before", "--detach", str(script)])
    assert first.exit_code == 0, first.output
    local_jobs.wait_for_job_status("before", {types.COMPLETE}, timeout=120)

    filler = fill(small_home)
    refused = CliRunner().invoke(cli, ["run", "--name", "after", "--detach", str(script)])
    assert refused.exit_code == 1, refused.output
    assert "no space left on device" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.output

    filler.unlink()
    listed = CliRunner().invoke(cli, ["list", "-o", "json"])
    assert listed.exit_code == 0, listed.output
    names = [item["metadata"]["name"] for item in json.loads(listed.stdout)["items"]]
    assert names == ["before"]  # the refused job left nothing behind
    (database,) = small_home.glob("*.db")
    with sqlite3.connect(database) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


#: Fills the disk under the job's logs, prints while it is full, frees it and prints once more; exits 0.
FILLS_THE_DISK = """
import os, sys, time
filler = os.path.join(sys.argv[1], "filler")
with open(filler, "wb") as out:
    try:
        while True:
            out.write(b"\\0" * 65536)
            out.flush()
    except OSError:
        pass
for i in range(200):
    print(f"while full {i}", flush=True)
time.sleep(0.5)
os.remove(filler)
time.sleep(0.2)
print("after", flush=True)
"""


def test_output_on_a_full_disk_is_dropped_without_stopping_training_and_said_once(
    small_home: Path, local_jobs: Any, tmp_path: Path
) -> None:
    script = tmp_path / "fills.py"
    script.write_text(FILLS_THE_DISK)
    ran = CliRunner().invoke(cli, ["run", "--name", "fills", "--detach", str(script), "--", str(small_home)])
    assert ran.exit_code == 0, ran.output
    job = local_jobs.wait_for_job_status("fills", {types.COMPLETE, types.FAILED}, timeout=120)
    assert job.status == types.COMPLETE, job
    text = "\n".join(line.text for line in local_jobs.logs("fills"))
    assert text.count("of output were dropped here: no space left on device") == 1, text[-3000:]
    assert "after" in text
