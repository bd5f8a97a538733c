"""Admission decisions read from the store, without starting anything: a scaled job runs alone, and a waiting
job's message says its queue, priority and what it waits for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trainjob.backends.local.process_specs import NodeProcessSpec, ProcessSpec
from trainjob.backends.local.queue import Machine, admit
from trainjob.backends.local.store import Store

MACHINE = Machine(cores=(0, 1), memory=16 * 2**30, gpus=())


def add_job(store: Store, name: str, status: str, created: float, cpus: int = 0, pinned: tuple[int, ...] = (),
            scaled: str | None = None, **queue: object) -> None:
    """A one-node job asking for ``cpus`` cores (pinned to ``pinned`` once admitted)."""
    launch = ProcessSpec(nodes=[NodeProcessSpec(0, ["python", "x.py"], {}, cpus=list(pinned))], cwd="/")
    store.insert_job({
        "name": name, "namespace": "default", "uid": name, "status": status, "reason": None, "message": None,
        "runtime": "torch-distributed", "num_nodes": 1, "num_proc_per_node": 1, "created": created,
        "resource": {"kind": "TrainJob"}, "launch": launch.to_dict(), "cpus": cpus, "scaled": scaled, **queue,
    })


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path / "home")
    yield opened
    opened.close()


def test_a_scaled_job_waits_until_no_job_runs_even_one_that_holds_nothing(store):
    add_job(store, "free-rider", "Running", created=1)  # best effort: holds no core
    add_job(store, "big", "Queued", created=2, cpus=16, scaled="16 CPUs asked, the 1 node(s) divide 2 core(s)")

    assert admit(store, MACHINE, now=10) == []
    big = store.get_job("big")
    assert (big["reason"], big["message"]) == (
        "WaitingForResources",
        "waiting for the machine to be free: the job is bigger than this machine, so it runs alone, scaled to it; "
        "running: free-rider",
    )

    store.transition("free-rider", "Complete", "Completed", "done", from_statuses=("Running",))
    assert admit(store, MACHINE, now=20) == ["big"]
    assert store.get_job("big")["status"] == "Created"


def test_nothing_is_admitted_while_a_scaled_job_runs_and_the_waiting_say_so(store):
    add_job(store, "big", "Created", created=1, cpus=16, pinned=(0,), scaled="16 CPUs asked")
    add_job(store, "small", "Queued", created=2, cpus=1)  # core 1 is free, but big runs alone

    assert admit(store, MACHINE, now=10) == []
    assert store.get_job("small")["message"] == (
        "waiting for 1 CPU(s) (1 of 2 free); held by big (big runs alone, scaled to this machine)"
    )


def test_a_scaled_job_admitted_in_a_pass_keeps_the_rest_of_the_queue_waiting(store):
    add_job(store, "big", "Queued", created=1, cpus=16, scaled="16 CPUs asked")
    add_job(store, "small", "Queued", created=2, cpus=1)

    assert admit(store, MACHINE, now=10) == ["big"]
    small = store.get_job("small")
    assert (small["status"], small["message"]) == (
        "Queued", "waiting for 1 CPU(s) (0 of 2 free); held by big (big runs alone, scaled to this machine)")


def test_the_waiting_and_admitted_messages_give_the_queue_and_priority_kueue_labels_gave(store):
    add_job(store, "holder", "Running", created=1, cpus=2, pinned=(0, 1))
    add_job(store, "urgent", "Queued", created=2, cpus=2, priority=1000, queue_name="team-a",
            priority_source="kueue.x-k8s.io/priority-class high")
    add_job(store, "plain", "Queued", created=3, cpus=2)

    assert admit(store, MACHINE, now=10) == []
    assert store.get_job("urgent")["message"] == (
        "waiting for 2 CPU(s) (0 of 2 free); queue team-a; priority 1000 (kueue.x-k8s.io/priority-class high); "
        "held by holder"
    )
    assert store.get_job("plain")["message"] == "waiting for 2 CPU(s) (0 of 2 free); 1 job(s) ahead in the queue; " \
        "held by holder"
    assert [(e["reason"], e["message"]) for e in store.events("urgent")] == [
        ("Queued", store.get_job("urgent")["message"])]

    store.transition("holder", "Complete", "Completed", "done", from_statuses=("Running",))
    assert admit(store, MACHINE, now=20) == ["urgent"]
    assert store.get_job("urgent")["message"] == (
        "admitted by the local queue (queue team-a, priority 1000 (kueue.x-k8s.io/priority-class high))"
    )
