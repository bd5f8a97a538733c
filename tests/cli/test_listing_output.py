"""``trainjob list -o json|yaml|name|wide`` read every job in one pass and print what ``get`` shows for each."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.backends.local.store import Store
from trainjob.cli.listing import indented_json
from trainjob.json_text import indented_json_list

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=30,
)


@given(JSON_VALUES)
def test_indented_json_is_json_dumps_with_an_indent_of_two(value):
    assert indented_json(value) == json.dumps(value, indent=2)


def test_indented_json_leaves_what_is_not_plain_json_to_json_dumps():
    class Name(str):
        pass

    for value in ({1: "a", "b": [math.inf, -math.inf]}, {"x": Name("n")}, [float("nan")], {"t": (1, 2)}):
        assert indented_json(value) == json.dumps(value, indent=2)


@given(st.lists(JSON_VALUES, max_size=4))
def test_a_list_of_indented_texts_is_written_as_indented_json_writes_the_list(items):
    outer = {"apiVersion": "v1", "kind": "List", "items": []}

    written = indented_json_list([indented_json(item) for item in items], outer, "items")

    assert written == json.dumps({**outer, "items": items}, indent=2)


def add_jobs(home: Path) -> list[str]:
    """Three finished jobs straight into the store: labels, nodes, a metrics record; no process started."""
    store = Store.open(home)
    now = time.time()
    names = []
    for i, (status, team) in enumerate([("Complete", "a"), ("Failed", "b"), ("Suspended", "a")]):
        name = f"job-{i}"
        store.insert_job({
            "name": name, "namespace": "default", "uid": f"uid-{i}", "status": status, "reason": status,
            "message": "done" if i else None, "runtime": "torch-distributed", "num_nodes": 2, "num_proc_per_node": 2,
            "created": now - 100 + i, "started": now - 90 + i, "finished": None if status == "Suspended" else now - 1,
            "resource": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                         "metadata": {"name": name, "labels": {"team": team}}, "spec": {"trainer": {"numNodes": 2}}},
            "launch": {"nodes": []},
        })
        for index in range(2):
            store.set_node(name, index, pid=None, status="Succeeded" if index else "Failed", exit_code=index,
                           started=now - 90, finished=now - 1)
        names.append(name)
    store.add_metrics("job-0", [{"time": now - 2, "step": 5, "total_steps": 10, "metrics": {"loss": 0.25}}])
    store.close()
    return names


def test_json_and_yaml_list_the_resources_get_shows(cli, trainjob_home):
    names = add_jobs(trainjob_home)
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))
    resources = [backend.get_job(name).resource for name in names]

    code, out, _ = cli("list", "-o", "json")
    assert code == 0
    assert json.loads(out) == {"apiVersion": "v1", "kind": "List", "items": resources}
    assert out.rstrip("\n") == json.dumps(json.loads(out), indent=2)
    assert resources[0]["status"]["trainerStatus"]["progressPercentage"] == 50

    code, out, _ = cli("list", "-o", "yaml", "-l", "team=a")
    assert code == 0
    assert yaml.safe_load(out)["items"] == [resources[0], resources[2]]

    assert cli("list", "-o", "name", "-l", "team!=a")[1] == "trainjob/job-1\n"


def test_listing_with_resources_gives_each_job_as_get_job_does(trainjob_home):
    names = add_jobs(trainjob_home)
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))

    assert backend.list_jobs_with_resources() == [backend.get_job(name) for name in names]
    assert backend.list_resources() == [backend.get_job(name).resource for name in names]
    assert [job.name for job in backend.list_jobs()] == names


def test_wide_lists_restarts_reasons_and_labels(cli, trainjob_home):
    add_jobs(trainjob_home)

    code, out, _ = cli("list", "-o", "wide")

    assert code == 0
    assert [line.split()[-3:] for line in out.splitlines()[1:]] == [
        ["0", "Complete", "team=a"], ["0", "Failed", "team=b"], ["0", "Suspended", "team=a"]]


def _finish_job_1(store: Store) -> None:
    store.transition("job-1", "Complete", "Completed", "all ranks exited 0", from_statuses=["Failed"])


def _replace_job_2(store: Store) -> None:
    row = store.get_job("job-2")
    store.delete_job("job-2")
    store.insert_job({**row, "uid": "uid-new", "resource": {**row["resource"], "spec": {"trainer": {"numNodes": 1}}}})


CHANGES = {
    "status": _finish_job_1,
    "node": lambda store: store.set_node("job-0", 1, status="Running"),
    "new node": lambda store: store.set_node("job-2", 2, status="Running"),
    "metrics": lambda store: store.add_metrics("job-0", [{"time": time.time(), "step": 9, "total_steps": 10,
                                                           "metrics": {"loss": 0.125}}]),
    "column": lambda store: store.update_job("job-1", scaled="numNodes 2 -> 1"),
    "deleted": lambda store: store.delete_job("job-1"),
    "replaced under its name": _replace_job_2,
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_json_listing_shows_each_job_as_it_is_now_after_a_change(trainjob_home, change):
    """The texts ``list -o json`` keeps in the store are dropped when their job (or its nodes) changes."""
    add_jobs(trainjob_home)
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))
    before = backend.list_resource_texts()

    change(backend.store)

    after = backend.list_resource_texts()
    assert after == [indented_json(resource) for resource in backend.list_resources()]
    assert after != before


def test_json_listing_of_a_store_from_before_texts_were_kept(trainjob_home):
    add_jobs(trainjob_home)
    store = Store.open(trainjob_home)
    for table in ("jobs", "nodes"):
        for event in ("insert", "update", "delete"):
            store._db.execute(f"DROP TRIGGER rendered_{table}_{event}")
    store._db.execute("DROP TABLE rendered")
    store.close()
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))

    backend.list_resource_texts()
    backend.store.update_job("job-0", message="changed")

    assert backend.list_resource_texts() == [indented_json(resource) for resource in backend.list_resources()]
