"""update_trainjob_status(): the Kubeflow SDK's in-job progress call, on rank 0, never raising."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch

from trainjob import update_trainjob_status as exported
from trainjob.torch import kubeflow_status
from trainjob.torch.metrics import update_trainjob_status


@pytest.fixture
def metrics_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("TRAINJOB_METRICS_FILE", str(path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv(kubeflow_status.SERVER_URL_ENV, raising=False)
    return path


def test_rank_0_prints_the_progress_line_and_records_it(metrics_file, capsys):
    assert exported is update_trainjob_status  # `from trainjob import update_trainjob_status`, as in kubeflow.trainer

    assert update_trainjob_status(progress_percent=42, estimated_remaining_seconds=120,
                                  metrics={"loss": torch.tensor(0.5), "phase": "eval"}) is True

    assert capsys.readouterr().out == "progress 42% eta 120s loss=0.5 phase=eval\n"
    record = json.loads(metrics_file.read_text())
    assert record | {"time": 0} == {"time": 0, "progress_percent": 42, "estimated_remaining_seconds": 120,
                                    "metrics": {"loss": 0.5}}  # the job's record keeps the numbers


def test_values_are_clamped_and_other_ranks_do_nothing(metrics_file, monkeypatch, capsys):
    update_trainjob_status(progress_percent=130, estimated_remaining_seconds=-3)
    assert capsys.readouterr().out == "progress 100% eta 0s\n"
    monkeypatch.setenv("RANK", "1")
    assert update_trainjob_status(progress_percent=50) is False
    assert capsys.readouterr().out == ""


def test_bad_values_return_false_instead_of_raising_as_kubeflows_does(metrics_file, capsys):
    assert update_trainjob_status(progress_percent="half") is False
    assert update_trainjob_status(metrics={"loss": object()}) is False
    assert not metrics_file.exists()


def test_under_kubeflow_trainer_the_update_is_posted_to_its_status_server(metrics_file, tmp_path, monkeypatch):
    received: list[tuple[str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.headers["Authorization"], body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    monkeypatch.setenv(kubeflow_status.SERVER_URL_ENV, f"http://127.0.0.1:{server.server_port}/status")
    monkeypatch.setenv(kubeflow_status.TOKEN_ENV, str(token))
    monkeypatch.setattr(kubeflow_status, "_last_sent", -1e9)
    try:
        update_trainjob_status(progress_percent=10, metrics={"loss": 1.25})
        update_trainjob_status(progress_percent=11)  # within 5 s of the last: waits
        update_trainjob_status(progress_percent=12)  # replaces the waiting one
        assert len(received) == 1
        assert kubeflow_status.flush()  # what exit does: the newest waiting update goes
        assert not kubeflow_status.flush()  # nothing waits any more
    finally:
        server.shutdown()

    (auth, body), (_, last) = received
    status = body["trainerStatus"]
    assert auth == "Bearer t0ken"
    assert (status["progressPercentage"], status["metrics"]) == (10, [{"name": "loss", "value": "1.25"}])
    assert "lastUpdatedTime" in status
    assert last["trainerStatus"]["progressPercentage"] == 12


def _status_server(port: int, answer: int, received: list[dict]) -> HTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(answer)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def endpoint(metrics_file, tmp_path, monkeypatch):
    """The status endpoint's variables, for a port nothing listens on yet (as while the operator's leader changes)."""
    from trainjob.ports import free_port

    port = free_port("127.0.0.1")
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    monkeypatch.setenv(kubeflow_status.SERVER_URL_ENV, f"http://127.0.0.1:{port}/status")
    monkeypatch.setenv(kubeflow_status.TOKEN_ENV, str(token))
    monkeypatch.setattr(kubeflow_status, "_last_sent", -1e9)
    monkeypatch.setattr(kubeflow_status, "_pending", None)
    yield port
    kubeflow_status.flush(retry_seconds=0)  # nothing left waiting for the tests after this one


def test_an_update_the_endpoint_did_not_get_is_sent_again_when_it_is_back(endpoint):
    received: list[dict] = []
    assert not kubeflow_status.send(100, 0, {"loss": 0.5})  # connection refused: kept
    server = _status_server(endpoint, 200, received)
    try:
        assert kubeflow_status.flush(retry_seconds=5)
    finally:
        server.shutdown()
        server.server_close()
    assert [r["trainerStatus"]["progressPercentage"] for r in received] == [100]


def test_at_exit_the_last_update_waits_for_an_endpoint_coming_back(endpoint):
    received: list[dict] = []
    assert not kubeflow_status.send(100, 0, {"loss": 0.5})
    timer = threading.Timer(1.5, lambda: servers.append(_status_server(endpoint, 200, received)))
    servers: list[HTTPServer] = []
    timer.start()
    try:
        assert kubeflow_status.flush(retry_seconds=10)  # what exit does: tried once a second meanwhile
    finally:
        timer.join()
        for server in servers:
            server.shutdown()
            server.server_close()
    assert len(received) == 1


def test_an_update_the_endpoint_refused_is_not_sent_again(endpoint):
    received: list[dict] = []
    server = _status_server(endpoint, 403, received)
    try:
        assert not kubeflow_status.send(100, 0, {"loss": 0.5})
        assert not kubeflow_status.flush(retry_seconds=0)  # nothing kept
    finally:
        server.shutdown()
        server.server_close()
    assert len(received) == 1
