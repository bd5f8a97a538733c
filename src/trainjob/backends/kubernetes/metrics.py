"""The operator's Prometheus metrics, in a registry of their own (several operators, or tests, in one process do not
share counters).

The operator reports through a few hooks and serves ``/metrics``; the API client it reconciles with is
instrumented so every HTTP request to the API server is counted with its verb and status code::

    metrics = OperatorMetrics(job_counts=lambda: {"Running": 3, "Complete": 10})
    api = KubeApi(metrics.instrument(load_api_client(config)))
    metrics.observe_reconcile("TrainJob", 0.12, "success")
    metrics.set_queue_depth("TrainJob", 4)
    port = metrics.serve("0.0.0.0", 8081)                  # GET http://host:8081/metrics

Metrics (type, labels):

- ``trainjob_operator_reconciles_total`` counter; ``kind``, ``result``: success | error | requeue_after
- ``trainjob_operator_reconcile_duration_seconds`` histogram; ``kind``
- ``trainjob_operator_queue_depth`` gauge; ``kind``
- ``trainjob_operator_queue_wait_seconds`` histogram; ``kind`` (from when a key was due until a worker took it)
- ``trainjob_operator_jobs`` gauge; ``state``: Created | Running | Suspended | Complete | Failed, asked of
  ``job_counts`` at each scrape
- ``trainjob_operator_api_requests_total`` counter; ``verb`` (GET, PUT ...), ``code`` (200, 404 ...; ``none``: no
  answer)
- ``trainjob_operator_status_reports_total`` counter; ``result``: accepted | rejected
- ``trainjob_operator_leader`` gauge: 1 while this replica holds the leader lease
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer


log = logging.getLogger("trainjob.operator")

PREFIX = "trainjob_operator"
RECONCILE_RESULTS = ("success", "error", "requeue_after")
JOB_STATES = ("Created", "Running", "Suspended", "Complete", "Failed")
STATUS_REPORT_RESULTS = ("accepted", "rejected")
#: The status label of a request that got no HTTP answer (connection refused, timeout, TLS failure).
NO_ANSWER = "none"

JobCounts = Callable[[], Mapping[str, int]]
C = TypeVar("C")


class OperatorMetrics:
    """The operator's metrics; ``job_counts`` (settable later) returns how many TrainJobs are in each state."""

    def __init__(self, job_counts: JobCounts | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.job_counts = job_counts
        r = self.registry
        self.reconciles = Counter(f"{PREFIX}_reconciles", "Reconcile passes, by result.", ["kind", "result"],
                                  registry=r)
        self.reconcile_duration = Histogram(f"{PREFIX}_reconcile_duration_seconds", "Time one reconcile pass took.",
                                            ["kind"], registry=r)
        self.queue_depth = Gauge(f"{PREFIX}_queue_depth", "Keys waiting in the work queue.", ["kind"], registry=r)
        self.queue_wait = Histogram(f"{PREFIX}_queue_wait_seconds",
                                    "Time a key waited from when it was due until a worker took it.", ["kind"],
                                    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0),
                                    registry=r)
        self.api_requests = Counter(f"{PREFIX}_api_requests", "HTTP requests to the Kubernetes API server.",
                                    ["verb", "code"], registry=r)
        self.status_reports = Counter(f"{PREFIX}_status_reports", "Progress reports from training pods, by result.",
                                      ["result"], registry=r)
        self.leader = Gauge(f"{PREFIX}_leader", "1 while this replica holds the leader lease.", registry=r)
        r.register(_JobsCollector(self))
        self._server: WSGIServer | None = None

    # -- hooks ----------------------------------------------------------------------------------------------------

    def observe_reconcile(self, kind: str, seconds: float, result: str) -> None:
        """One reconcile pass of a ``kind`` object (``TrainJob``, ``PyTorchJob``) took ``seconds``."""
        if result not in RECONCILE_RESULTS:
            raise ValueError(f"result: must be one of {', '.join(RECONCILE_RESULTS)}, got {result!r}")
        self.reconciles.labels(kind, result).inc()
        self.reconcile_duration.labels(kind).observe(seconds)

    def set_queue_depth(self, kind: str, n: int) -> None:
        self.queue_depth.labels(kind).set(n)

    def observe_queue_wait(self, kind: str, seconds: float) -> None:
        """A worker took a ``kind`` key ``seconds`` after it became due."""
        self.queue_wait.labels(kind).observe(max(seconds, 0.0))

    def observe_status_report(self, accepted: bool) -> None:
        self.status_reports.labels("accepted" if accepted else "rejected").inc()

    def set_leader(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    # -- API client -----------------------------------------------------------------------------------------------

    def instrument(self, client: C) -> C:
        """Count every request ``client`` sends (by HTTP method and status code); returns ``client``: a
        :class:`~trainjob.backends.kubernetes.rest.RestClient` (its ``on_response``) or a ``kubernetes``
        ``ApiClient`` (its ``rest_client.request``, which every API call goes through). Instrumenting a client
        twice counts once."""
        from trainjob.backends.kubernetes.rest import RestClient

        if isinstance(client, RestClient):
            client.on_response = lambda method, status: self.api_requests.labels(
                method.upper(), str(status) if status else NO_ANSWER).inc()
            return client
        rest = client.rest_client
        if getattr(rest.request, "trainjob_metrics", None) is self:
            return client
        send = rest.request

        @functools.wraps(send)
        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            code = NO_ANSWER
            try:
                response = send(method, url, *args, **kwargs)
                code = str(response.status)
                return response
            except Exception as exc:
                status = getattr(exc, "status", None)
                if isinstance(status, int) and status > 0:  # ApiException(status=0): no answer (TLS, bad request)
                    code = str(status)
                raise
            finally:
                self.api_requests.labels(method.upper(), code).inc()

        request.trainjob_metrics = self  # type: ignore[attr-defined]
        rest.request = request
        return client

    # -- exposition -----------------------------------------------------------------------------------------------

    def render(self) -> bytes:
        """The metrics in Prometheus' text format (what ``/metrics`` answers)."""
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns the port (``port=0``: a free one)."""
        from prometheus_client import start_http_server

        if self._server is not None:
            raise RuntimeError(f"metrics are served on port {self._server.server_port} already")
        self._server, _ = start_http_server(port, host, registry=self.registry)
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop serving (if :meth:`serve` was called)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _JobsCollector(Collector):
    """``trainjob_operator_jobs{state}``, computed when scraped from the operator's cache of TrainJobs."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(f"{PREFIX}_jobs", "TrainJobs by state.", labels=["state"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(f"{PREFIX}_jobs", "TrainJobs by state.", labels=["state"])
        source = self.metrics.job_counts
        if source is None:
            return
        try:
            counts = source()
        except Exception:  # a failing callback must not fail the whole scrape
            log.exception("counting TrainJobs for %s_jobs failed", PREFIX)
            return
        for state in JOB_STATES:
            family.add_metric([state], float(counts.get(state, 0)))
        yield family
