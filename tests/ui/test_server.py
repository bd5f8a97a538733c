"""The dashboard's HTTP API, without a browser: what it answers, and what it refuses."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

import pytest
from jobtest.local import trainjob_resource

from trainjob.ui.server import plotly_bundle

ACTION = {"X-Trainjob-Action": "1"}


@dataclass
class Answer:
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode()

    def json(self):
        return json.loads(self.content)


class Client:
    """Plain HTTP against the dashboard served on loopback (the ``dashboard`` fixture)."""

    def __init__(self, base: str) -> None:
        self.base = base

    def request(self, method: str, path: str, params=None, headers=None) -> Answer:
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        request = urllib.request.Request(url, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return Answer(response.status, response.read())
        except urllib.error.HTTPError as error:
            return Answer(error.code, error.read())

    def get(self, path, params=None, headers=None) -> Answer:
        return self.request("GET", path, params, headers)

    def delete(self, path, headers=None) -> Answer:
        return self.request("DELETE", path, headers=headers)


@pytest.fixture
def client(dashboard):
    return Client(dashboard)


@pytest.fixture
def script(tmp_path):
    def write(name, source):
        path = tmp_path / name
        path.write_text(source, encoding="utf-8")
        return str(path)

    return write


def finished_job(backend, script, name="done", lines=3):
    source = script(f"{name}.py", f"for i in range({lines}):\n    print(f'line {{i}}', flush=True)\n")
    backend.apply(trainjob_resource(name, [sys.executable, source]))
    backend.wait_for_job_status(name, timeout=60)


def test_list_filters_newest_first_and_counts_every_job(backend, client, script):
    for name in ("alpha", "beta", "alpine"):
        finished_job(backend, script, name)

    body = client.get("/api/jobs", params={"q": "al", "limit": 1}).json()

    assert (body["total"], body["matching"], body["counts"]) == (3, 2, {"Complete": 3})
    assert [job["name"] for job in body["jobs"]] == ["alpine"]
    assert client.get("/api/jobs", params={"status": "Failed"}).json()["jobs"] == []


def test_job_logs_and_metrics(backend, client, script):
    finished_job(backend, script)
    backend.store.add_metrics("done", [{"time": 1.0, "step": 1, "metrics": {"loss": 2.0}},
                                       {"time": 2.0, "step": 2, "metrics": {"loss": 1.0}}])

    job = client.get("/api/jobs/done").json()
    assert (job["status"], job["nodes"], job["resource"]["metadata"]["name"]) == ("Complete", 1, "done")
    assert "Created" in [event["reason"] for event in job["events"]]
    first = client.get("/api/jobs/done/metrics").json()
    assert [r["metrics"]["loss"] for r in first["records"]] == [2.0, 1.0]
    assert client.get("/api/jobs/done/metrics", params={"after": first["last"]}).json()["records"] == []

    stream = client.get("/api/jobs/done/logs", params={"node": 0}).text
    batches = [json.loads(line[len("data: "):]) for line in stream.splitlines() if line.startswith("data: [")]
    assert [entry["text"] for batch in batches for entry in batch] == ["line 0", "line 1", "line 2"]
    assert stream.rstrip().endswith("event: end\ndata: {}")


def test_errors_name_the_problem(backend, client, script):
    finished_job(backend, script)
    assert client.get("/api/jobs/nope").status_code == 404
    assert "not found" in client.get("/api/jobs/nope/metrics").json()["error"]
    response = client.get("/api/jobs/done/logs", params={"node": 5})
    assert response.status_code == 400 and "node: must be 0..0" in response.json()["error"]


def test_actions_need_the_action_header_and_a_loopback_host(backend, client, script):
    finished_job(backend, script)

    refused = client.delete("/api/jobs/done")
    assert refused.status_code == 403 and "X-Trainjob-Action" in refused.json()["error"].title()
    assert client.get("/api/jobs", headers={"Host": "attacker.example"}).status_code == 400
    assert backend.get_job("done").status == "Complete"

    assert client.delete("/api/jobs/done", headers=ACTION).json() == {"name": "done", "done": "delete"}
    assert client.get("/api/jobs/done").status_code == 404


def test_pages_and_the_chart_library_are_served(client):
    assert "<table id=\"jobs\">" in client.get("/").text
    assert "job.js" in client.get("/jobs/anything").text
    plotly = client.get("/static/plotly.min.js")
    assert plotly.status_code == 200 and len(plotly.content) == plotly_bundle().stat().st_size


def test_trainjob_ui_serves_on_loopback_until_interrupted(subprocesses, trainjob_home):
    import signal
    import subprocess

    process = subprocess.Popen([sys.executable, "-m", "trainjob.cli.main", "ui", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("trainjob dashboard on http://127.0.0.1:") and "(local backend)" in line, line
        url = line.split(" on ", 1)[1].split()[0].rstrip("/")
        assert Client(url).get("/api/jobs").json()["total"] == 0
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(15) == 130, process.stderr.read()  # the CLI's exit code for "interrupted"
    assert "Traceback" not in process.stderr.read()
