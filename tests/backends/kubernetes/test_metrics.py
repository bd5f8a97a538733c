"""The operator's metrics: hooks in, ``/metrics`` scraped over HTTP and parsed; API requests counted from a real
``kubernetes.client.ApiClient`` talking to a small local HTTP server."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trainjob.backends.kubernetes.metrics import OperatorMetrics
from trainjob.ports import free_port

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: bytes) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return parse(response.read())


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
def metrics() -> Iterator[OperatorMetrics]:
    metrics = OperatorMetrics()
    yield metrics
    metrics.close()


def test_hooks_are_counted_exactly_in_the_served_metrics(metrics: OperatorMetrics) -> None:
    metrics.observe_reconcile("TrainJob", 0.2, "success")
    metrics.observe_reconcile("TrainJob", 0.3, "success")
    metrics.observe_reconcile("TrainJob", 1.5, "error")
    metrics.observe_reconcile("PyTorchJob", 0.1, "requeue_after")
    metrics.set_queue_depth("TrainJob", 7)
    metrics.set_queue_depth("TrainJob", 3)
    metrics.observe_queue_wait("TrainJob", 0.004)
    metrics.observe_queue_wait("TrainJob", 2.0)
    metrics.observe_status_report(accepted=True)
    metrics.observe_status_report(accepted=True)
    metrics.observe_status_report(accepted=False)
    metrics.set_leader(True)
    port = metrics.serve("127.0.0.1", 0)
    assert port > 0

    got = scrape(port)
    reconciles = "trainjob_operator_reconciles_total"
    assert value(got, reconciles, kind="TrainJob", result="success") == 2
    assert value(got, reconciles, kind="TrainJob", result="error") == 1
    assert value(got, reconciles, kind="PyTorchJob", result="requeue_after") == 1
    assert value(got, reconciles, kind="PyTorchJob", result="success") is None
    duration = "trainjob_operator_reconcile_duration_seconds"
    assert value(got, f"{duration}_count", kind="TrainJob") == 3
    assert value(got, f"{duration}_sum", kind="TrainJob") == pytest.approx(2.0)
    assert value(got, f"{duration}_bucket", kind="TrainJob", le="0.25") == 1
    assert value(got, "trainjob_operator_queue_depth", kind="TrainJob") == 3
    wait = "trainjob_operator_queue_wait_seconds"
    assert value(got, f"{wait}_count", kind="TrainJob") == 2
    assert value(got, f"{wait}_bucket", kind="TrainJob", le="0.005") == 1
    assert value(got, f"{wait}_sum", kind="TrainJob") == pytest.approx(2.004)
    reports = "trainjob_operator_status_reports_total"
    assert value(got, reports, result="accepted") == 2
    assert value(got, reports, result="rejected") == 1
    assert value(got, "trainjob_operator_leader") == 1

    metrics.set_leader(False)
    metrics.observe_reconcile("TrainJob", 0.2, "success")
    again = scrape(port)
    assert value(again, "trainjob_operator_leader") == 0
    assert value(again, reconciles, kind="TrainJob", result="success") == 3


def test_job_states_are_counted_at_scrape_time_from_the_callback(metrics: OperatorMetrics) -> None:
    cache = {"Running": 2, "Complete": 5}
    metrics.job_counts = lambda: dict(cache)
    port = metrics.serve("127.0.0.1", 0)

    first = scrape(port)
    jobs = "trainjob_operator_jobs"
    assert {state: value(first, jobs, state=state) for state in ("Created", "Running", "Suspended", "Complete",
                                                                  "Failed")} == {
        "Created": 0, "Running": 2, "Suspended": 0, "Complete": 5, "Failed": 0}

    cache.update(Running=1, Failed=1)
    second = scrape(port)
    assert value(second, jobs, state="Running") == 1
    assert value(second, jobs, state="Failed") == 1


def test_a_failing_job_count_callback_leaves_the_rest_of_the_scrape_intact(metrics: OperatorMetrics) -> None:
    def broken() -> dict[str, int]:
        raise RuntimeError("cache not synced")

    metrics.job_counts = broken
    metrics.set_leader(True)
    got = scrape(metrics.serve("127.0.0.1", 0))
    assert value(got, "trainjob_operator_leader") == 1
    assert not [key for key in got if key[0] == "trainjob_operator_jobs"]


def test_two_operators_in_one_process_keep_separate_counts() -> None:
    first, second = OperatorMetrics(), OperatorMetrics()
    first.observe_reconcile("TrainJob", 0.1, "success")
    reconciles = "trainjob_operator_reconciles_total"
    assert value(parse(first.render()), reconciles, kind="TrainJob", result="success") == 1
    assert value(parse(second.render()), reconciles, kind="TrainJob", result="success") is None


def test_an_unknown_reconcile_result_is_refused(metrics: OperatorMetrics) -> None:
    with pytest.raises(ValueError, match="result: must be one of success, error, requeue_after, got 'ok'"):
        metrics.observe_reconcile("TrainJob", 0.1, "ok")


def test_serving_twice_is_refused(metrics: OperatorMetrics) -> None:
    port = metrics.serve("127.0.0.1", 0)
    with pytest.raises(RuntimeError, match=str(port)):
        metrics.serve("127.0.0.1", 0)


# -- API requests -----------------------------------------------------------------------------------------------


class _FakeApiServer(http.server.BaseHTTPRequestHandler):
    """200 with a Pod for ``pods/present``, 404 for anything else; DELETE answers 409."""

    def _answer(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.startswith("/api/v1/namespaces/default/pods/present"):
            self._answer(200, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "present"}})
        else:
            self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})

    def do_DELETE(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(409, {"kind": "Status", "code": 409, "reason": "Conflict"})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(10)


def _core(host: str):  # type: ignore[no-untyped-def]
    import kubernetes.client

    configuration = kubernetes.client.Configuration()
    configuration.host = host
    configuration.retries = False
    return kubernetes.client.ApiClient(configuration)


def test_requests_through_an_instrumented_client_are_counted_by_verb_and_code(
    metrics: OperatorMetrics, api_server: str
) -> None:
    import kubernetes.client

    client = metrics.instrument(_core(api_server))
    metrics.instrument(client)  # a second time counts nothing twice
    core = kubernetes.client.CoreV1Api(client)
    try:
        pod = core.read_namespaced_pod("present", "default", _preload_content=False)
        assert json.loads(pod.data)["metadata"]["name"] == "present"
        core.read_namespaced_pod("present", "default", _preload_content=False)
        with pytest.raises(kubernetes.client.ApiException) as missing:
            core.read_namespaced_pod("absent", "default")
        assert missing.value.status == 404
        with pytest.raises(kubernetes.client.ApiException):
            core.delete_namespaced_pod("present", "default")
    finally:
        client.close()

    got = scrape(metrics.serve("127.0.0.1", 0))
    requests = "trainjob_operator_api_requests_total"
    assert value(got, requests, verb="GET", code="200") == 2
    assert value(got, requests, verb="GET", code="404") == 1
    assert value(got, requests, verb="DELETE", code="409") == 1
    assert sum(v for (name, _), v in got.items() if name == requests) == 4


def test_a_request_that_gets_no_answer_is_counted_with_code_none(metrics: OperatorMetrics) -> None:
    import kubernetes.client

    client = metrics.instrument(_core(f"http://127.0.0.1:{free_port()}"))
    try:
        with pytest.raises(Exception):  # noqa: B017 (urllib3's connection error, whatever its class)
            kubernetes.client.CoreV1Api(client).list_namespaced_pod("default", _request_timeout=(2, 2))
    finally:
        client.close()
    got = parse(metrics.render())
    assert value(got, "trainjob_operator_api_requests_total", verb="GET", code="none") == 1


def test_an_uninstrumented_client_is_not_counted(metrics: OperatorMetrics, api_server: str) -> None:
    import kubernetes.client

    client = _core(api_server)
    try:
        kubernetes.client.CoreV1Api(client).read_namespaced_pod("present", "default", _preload_content=False)
    finally:
        client.close()
    assert not [key for key in parse(metrics.render()) if key[0] == "trainjob_operator_api_requests_total"]
