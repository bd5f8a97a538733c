"""The SQLite store: several processes at once, first transition wins, names that cannot escape the home."""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path

import pytest

from trainjob.backends.local.store import Store
from trainjob.errors import AlreadyExistsError, NotFoundError, ValidationError

# Spawned writers import their function by module name; spawn children inherit sys.path.
sys.path.insert(0, str(Path(__file__).parent))
from store_workers import job_row, write_jobs  # noqa: E402


def test_several_processes_write_at_once_without_losing_rows(subprocesses, tmp_path: Path):
    home = str(tmp_path / "home")
    Store.open(home).close()
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=write_jobs, args=(home, w, 40)) for w in range(4)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
        assert process.exitcode == 0

    store = Store.open(home)
    rows = store.list_jobs()
    assert len(rows) == 160 and {r["status"] for r in rows} == {"Running"}
    assert [r["created"] for r in rows] == sorted(r["created"] for r in rows)
    assert all(len(store.events(r["name"])) == 1 and store.nodes(r["name"])[0]["status"] == "Running" for r in rows)
    assert store.get_job("w3-39")["step"] == 39


def test_a_taken_name_is_refused_and_the_first_job_kept(tmp_path: Path):
    store = Store.open(tmp_path)
    store.insert_job(job_row("taken"))
    with pytest.raises(AlreadyExistsError, match="'taken' already exists"):
        store.insert_job({**job_row("taken"), "uid": "other"})
    assert store.get_job("taken")["uid"] == "uid-taken"


def test_only_the_first_of_two_competing_transitions_wins(tmp_path: Path):
    store = Store.open(tmp_path)
    store.insert_job(job_row("race", status="Running"))
    assert store.transition("race", "Complete", "Completed", "done", from_statuses=("Running",))
    assert not store.transition("race", "Failed", "SupervisorLost", "late", from_statuses=("Running",))
    assert store.get_job("race")["status"] == "Complete"


def test_deleting_a_job_removes_its_rows_everywhere(tmp_path: Path):
    store = Store.open(tmp_path)
    store.insert_job(job_row("gone"))
    store.add_event("gone", "Created", "x")
    store.set_node("gone", 0, status="Running")
    store.add_metrics("gone", [{"time": 1.0, "metrics": {}}])
    store.delete_job("gone")
    with pytest.raises(NotFoundError, match="'gone' not found"):
        store.get_job("gone")
    assert (store.events("gone"), store.nodes("gone"), store.metrics("gone")) == ([], [], [])


@pytest.mark.parametrize("name", ["../escape", "a/b", "UPPER", "-dash", "dash-", "9lives", "", "x" * 64, "a.b"])
def test_job_directories_never_leave_the_home(tmp_path: Path, name: str):
    store = Store.open(tmp_path)
    with pytest.raises(ValidationError, match="RFC 1035"):
        store.job_dir(name)


def test_metrics_update_the_jobs_progress_columns(tmp_path: Path):
    store = Store.open(tmp_path)
    store.insert_job(job_row("m"))
    store.add_metrics("m", [{"time": 10.0, "step": 5, "total_steps": 50, "metrics": {"loss": 2.0}}])
    store.add_metrics("m", [{"time": 20.0, "step": 15, "total_steps": 50, "metrics": {"loss": 1.0}}])
    row = store.get_job("m")
    assert (row["step"], row["first_step"], row["first_metrics_time"], row["metrics_time"]) == (15, 5, 10.0, 20.0)
    assert [m["metrics"]["loss"] for m in store.metrics("m")] == [2.0, 1.0]


def test_job_directory_names_are_matched_whole() -> None:
    """A trailing newline would pass a ``^...$`` match; the name becomes a directory under $TRAINJOB_HOME."""
    from trainjob.backends.local.store import check_job_name
    from trainjob.errors import ValidationError

    check_job_name("mnist-2")
    for bad in ("mnist\n", "Mnist", "-mnist", "a" * 64):
        with pytest.raises(ValidationError):
            check_job_name(bad)
