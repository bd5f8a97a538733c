"""Rows and writers shared by the store tests; importable by spawned processes."""

from __future__ import annotations

from trainjob.backends.local.store import Store


def job_row(name: str, created: float = 1.0, status: str = "Created") -> dict:
    return {
        "name": name, "namespace": "default", "uid": f"uid-{name}", "status": status, "reason": None,
        "message": None, "runtime": "torch-distributed", "num_nodes": 2, "num_proc_per_node": 2,
        "created": created, "resource": {"kind": "TrainJob"}, "launch": {"nodes": []},
    }


def write_jobs(home: str, worker: int, count: int) -> None:
    store = Store.open(home)
    for i in range(count):
        name = f"w{worker}-{i}"
        store.insert_job(job_row(name, created=worker * 1000 + i))
        store.add_event(name, "Created", "made")
        store.set_node(name, 0, status="Running", pid=i)
        store.add_metrics(name, [{"time": float(i), "step": i, "total_steps": count, "metrics": {"loss": 1.0}}])
        store.transition(name, "Running", "NodesStarted", "", from_statuses=("Created",))
