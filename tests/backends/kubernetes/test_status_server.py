"""The status endpoint's parts that need no cluster: what a report may say, what the pods are given, and the
certificate they verify the endpoint by (a real TLS handshake on loopback)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import sys
import threading
import time
from typing import Any
from urllib.parse import urljoin

import pytest
from kubetest.memory_api import MemoryApi

from trainjob.backends.kubernetes.cache import ObjectCache
from trainjob.backends.kubernetes.kubeapi import ApiError
from trainjob.backends.kubernetes.resources import CONFIGMAPS, SECRETS, TRAINJOBS
from trainjob.backends.kubernetes.status_server import (
    CA_CONFIGMAP,
    VOLUME,
    NamespaceCA,
    Refused,
    StatusEndpoint,
    StatusServer,
    collectives_of,
    inject_status_client,
    trainer_status_of,
)
from trainjob.backends.kubernetes.tls import (
    NAMES_ANNOTATION,
    TLS_SECRET,
    issue,
    load_or_create_serving_tls,
    noted_names,
)


def test_a_full_report_is_kept_and_its_time_normalised() -> None:
    body = {"trainerStatus": {"progressPercentage": 42.7, "estimatedRemainingSeconds": 120,
                              "metrics": [{"name": "loss", "value": "0.43"}],
                              "lastUpdatedTime": "2026-11-24T10:30:45.123456+00:00"}}
    assert trainer_status_of(body) == {"progressPercentage": 42, "estimatedRemainingSeconds": 120,
                                       "metrics": [{"name": "loss", "value": "0.43"}],
                                       "lastUpdatedTime": "2026-11-24T10:30:45Z"}


def test_a_report_without_a_time_is_stamped_now() -> None:
    status = trainer_status_of({"trainerStatus": {"progressPercentage": 5}})
    assert set(status) == {"progressPercentage", "lastUpdatedTime"} and status["lastUpdatedTime"].endswith("Z")


@pytest.mark.parametrize(("body", "words"), [
    ([], '{"trainerStatus": {...}}'),
    ({"trainerStatus": "50%"}, '{"trainerStatus": {...}}'),
    ({"trainerStatus": {"progress": 5}}, "unknown field(s) ['progress']"),
    ({"trainerStatus": {"progressPercentage": 101}}, "progressPercentage: must be an integer 0..100, got 101"),
    ({"trainerStatus": {"progressPercentage": True}}, "progressPercentage: must be an integer 0..100, got True"),
    ({"trainerStatus": {"estimatedRemainingSeconds": -1}}, "estimatedRemainingSeconds: must be an integer >= 0"),
    ({"trainerStatus": {"estimatedRemainingSeconds": float("inf")}}, "estimatedRemainingSeconds: must be"),
    ({"trainerStatus": {"metrics": [{"name": "loss", "value": 0.4}]}}, 'metrics: must be a list of at most'),
    ({"trainerStatus": {"metrics": {"loss": "0.4"}}}, 'metrics: must be a list of at most'),
    ({"trainerStatus": {"lastUpdatedTime": "yesterday"}}, "lastUpdatedTime: must be an RFC 3339 time"),
    ({"trainerStatus": {"lastUpdatedTime": "2026-11-24T10:30:45"}}, "lastUpdatedTime: must be an RFC 3339 time"),
])
def test_a_malformed_report_is_refused_naming_the_field(body: Any, words: str) -> None:
    with pytest.raises(Refused) as refused:
        trainer_status_of(body)
    assert refused.value.status == 400 and words in str(refused.value)


def test_a_written_report_is_handed_on_though_its_watch_event_will_be_an_echo() -> None:
    """The operator queues nothing for the watch event of its own write, so the server says when it wrote a report:
    the stall watch times the silence between reports and must see each one."""
    api = MemoryApi(clock=lambda: 0.0)
    cache = ObjectCache()
    cache.store(TRAINJOBS, api.seed({"apiVersion": TRAINJOBS.api_version, "kind": TRAINJOBS.kind,
                                     "metadata": {"name": "mnist", "namespace": "ml"}, "spec": {}}))
    written: list[tuple[str, str]] = []
    now = [100.0]
    server = StatusServer(api, cache, tls=None, min_interval=5.0, clock=lambda: now[0],
                          on_written=lambda namespace, name: written.append((namespace, name)))
    report = trainer_status_of({"trainerStatus": {"progressPercentage": 5}})

    async def reports() -> None:
        await server._accept(("ml", "mnist"), report)
        await server._accept(("ml", "mnist"), report)  # within the interval: waits, and is then the same
        await asyncio.sleep(0.01)

    asyncio.run(reports())
    stored = api.objects[(TRAINJOBS.group, TRAINJOBS.plural, "ml", "mnist")]
    assert stored["status"]["trainerStatus"] == report
    assert cache.holds(TRAINJOBS, stored), "the write's watch event is an echo the operator does not queue"
    assert written == [("ml", "mnist")]


def test_a_collectives_report_is_dated_by_the_endpoints_clock() -> None:
    report = collectives_of({"rank": 1, "completedAgo": 2.5, "waitingFor": None}, now=100.0)
    assert (report.rank, report.completed_at, report.waiting_since) == (1, 97.5, None)


@pytest.mark.parametrize(("body", "words"), [
    ([], '{"rank": int, "completedAgo": seconds or null, "waitingFor": seconds or null}'),
    ({"rank": 0, "completed": 1}, '{"rank": int'),
    ({"rank": "0"}, "rank: must be an integer >= 0, got '0'"),
    ({"rank": True}, "rank: must be an integer >= 0"),
    ({"rank": 0, "completedAgo": -1}, "completedAgo: must be seconds >= 0 or null, got -1"),
    ({"rank": 0, "waitingFor": float("nan")}, "waitingFor: must be seconds >= 0 or null"),
])
def test_a_malformed_collectives_report_is_refused_naming_the_field(body: Any, words: str) -> None:
    with pytest.raises(Refused) as refused:
        collectives_of(body, now=100.0)
    assert refused.value.status == 400 and words in str(refused.value)


def jobset(env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "node", "image": "x"}
    if env is not None:
        container["env"] = env
    return {"metadata": {"name": "mnist", "namespace": "ml"}, "spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [container]}}}}}]}}


def test_every_container_gets_the_endpoint_the_token_and_the_ca_and_keeps_its_own_values() -> None:
    endpoint = StatusEndpoint("https://10.0.0.1:8443/", "CA PEM")
    obj = jobset([{"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": "mine"}, {"name": "A", "value": "1"}])
    inject_status_client(obj, endpoint)
    inject_status_client(obj, endpoint)  # twice changes nothing more
    template = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    env = {e["name"]: e["value"] for e in template["spec"]["containers"][0]["env"]}
    assert env == {"KUBEFLOW_TRAINER_SERVER_URL": "mine", "A": "1",
                   "KUBEFLOW_TRAINER_SERVER_TOKEN": "/var/run/secrets/trainer.kubeflow.org/token",
                   "KUBEFLOW_TRAINER_SERVER_CA_CERT": "/var/run/secrets/trainer.kubeflow.org/ca.crt",
                   "TRAINJOB_COLLECTIVES_URL": "collectives"}
    assert "metadata" not in template  # the CA is the namespace's ConfigMap, not a copy in every pod
    (volume,) = template["spec"]["volumes"]
    token, ca, stacks = volume["projected"]["sources"]
    assert volume["name"] == VOLUME and token["serviceAccountToken"]["audience"] == "trainer.kubeflow.org"
    assert ca == {"configMap": {"name": CA_CONFIGMAP, "optional": True}}
    assert stacks["downwardAPI"]["items"][0]["path"] == "stacks-request"
    assert template["spec"]["containers"][0]["volumeMounts"] == [
        {"name": VOLUME, "mountPath": "/var/run/secrets/trainer.kubeflow.org", "readOnly": True}]
    fresh = jobset()
    inject_status_client(fresh, endpoint)
    env = fresh["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
    status = "https://10.0.0.1:8443/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/mnist/status"
    assert env[0]["value"] == status
    # the collectives URL is the relative reference the pods resolve against the status URL (RFC 3986)
    assert urljoin(status, env[3]["value"]) == status.removesuffix("status") + "collectives"


def test_the_ca_configmap_is_made_once_per_namespace_and_mended_where_it_differs() -> None:
    api = MemoryApi(clock=lambda: 0.0)
    api.seed({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CA_CONFIGMAP, "namespace": "old"},
              "data": {"ca.crt": "OLD"}}, CONFIGMAPS)
    keeper = NamespaceCA(api, "CA PEM", {"metadata": {"name": "trainjob-system", "uid": "u-1"}})
    for _ in range(3):  # three jobs in each namespace
        keeper.ensure("ml")
        keeper.ensure("old")
    # once per namespace, none per job
    assert [(verb, where) for verb, _, where in api.requests] == [
        ("create", "ml/trainjob-status-ca"), ("create", "old/trainjob-status-ca"), ("get", "old/trainjob-status-ca"),
        ("patch", "old/trainjob-status-ca")]
    made = api.stored(CONFIGMAPS, "ml", CA_CONFIGMAP)
    assert made is not None and made["data"] == {"ca.crt": "CA PEM"}
    assert made["metadata"]["labels"] == {"app.kubernetes.io/part-of": "trainjob"}
    assert made["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Namespace", "name": "trainjob-system", "uid": "u-1"}]
    mended = api.stored(CONFIGMAPS, "old", CA_CONFIGMAP)
    assert mended is not None and mended["data"] == {"ca.crt": "CA PEM"}  # a CA put in by hand, replaced


def test_a_ca_configmap_that_cannot_be_made_is_tried_again_at_the_next_job(caplog: pytest.LogCaptureFixture) -> None:
    class Forbidden(MemoryApi):  # what an API server answers an operator whose role lacks configmaps
        refuse = True

        def create(self, obj: dict[str, Any], ref: Any = None, timeout: float | None = None) -> dict[str, Any]:
            if self.refuse:
                self._record("create", "configmaps", "refused")
                raise ApiError("cannot create ConfigMap: the API server answered 403 Forbidden", 403)
            return super().create(obj, ref, timeout)

    api = Forbidden(clock=lambda: 0.0)
    keeper = NamespaceCA(api, "CA PEM")
    keeper.ensure("ml")
    keeper.ensure("ml")
    assert len(api.requests) == 2 and "cannot keep ConfigMap ml/trainjob-status-ca" in caplog.text
    api.refuse = False
    keeper.ensure("ml")
    keeper.ensure("ml")
    assert len(api.requests) == 3
    made = api.stored(CONFIGMAPS, "ml", CA_CONFIGMAP)
    assert made is not None and "ownerReferences" not in made["metadata"]


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> str:
    """Serve one TLS connection on loopback; what the client read."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"hello")
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with socket.create_connection(("127.0.0.1", port)) as raw, \
                client.wrap_socket(raw, server_hostname=host) as tls:
            return tls.recv(5).decode()
    finally:
        thread.join(5)
        listener.close()


def test_the_serving_certificate_verifies_for_its_names_against_the_ca_only() -> None:
    tls, ca_key = issue(["trainjob-operator.trainjob-system.svc", "127.0.0.1"])
    assert tls.names() == {"trainjob-operator.trainjob-system.svc", "127.0.0.1"}
    client = ssl.create_default_context(cadata=tls.ca_pem)
    assert handshake(tls.server_context(), client, "127.0.0.1") == "hello"
    with pytest.raises(ssl.SSLCertVerificationError):  # a name the certificate does not carry
        handshake(tls.server_context(), client, "elsewhere.example")
    again, _ = issue(["10.1.2.3"], tls.ca_pem, ca_key)  # issued again from the same CA: the pods' CA stays good
    assert again.ca_pem == tls.ca_pem and handshake(again.server_context(), client, "10.1.2.3") == "hello"
    stranger, _ = issue(["127.0.0.1"])  # another CA
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(stranger.server_context(), client, "127.0.0.1")


SERVICE = "trainjob-operator.trainjob-system.svc"


def test_the_secret_notes_its_names_so_a_restart_needs_no_certificate_parsing() -> None:
    """The first start makes the Secret, noting the certificate's names with its digest; later starts read the
    note. A Secret from before (no note) is parsed once and noted; one whose certificate was replaced by hand (the
    digest differs) is parsed, and issued again from its CA when a name is missing."""
    api = MemoryApi(time.time)
    first = load_or_create_serving_tls(api, "trainjob-system", [SERVICE])
    secret = api.read_secret("trainjob-system", TLS_SECRET)
    assert secret is not None
    assert noted_names(secret["metadata"]["annotations"][NAMES_ANNOTATION], first.cert_pem) == {SERVICE}
    assert load_or_create_serving_tls(api, "trainjob-system", [SERVICE]) == first

    api.patch(SECRETS, "trainjob-system", TLS_SECRET, {"metadata": {"annotations": {NAMES_ANNOTATION: None}}})
    assert load_or_create_serving_tls(api, "trainjob-system", [SERVICE]) == first
    secret = api.read_secret("trainjob-system", TLS_SECRET)
    assert secret is not None and NAMES_ANNOTATION in secret["metadata"]["annotations"]  # noted again

    by_hand, _ = issue(["10.0.0.9"])  # another certificate, under the old note: the note is not believed
    secret["data"]["tls.crt"] = base64.b64encode(by_hand.cert_pem.encode()).decode()
    assert api.replace(secret, SECRETS) is not None
    again = load_or_create_serving_tls(api, "trainjob-system", [SERVICE])
    assert again.ca_pem == first.ca_pem and again.names() == {SERVICE, "10.0.0.9"}


def test_a_restart_with_a_noted_secret_loads_no_cryptography(tmp_path: Any, subprocesses: Any) -> None:
    """The operator's memory: ``cryptography`` is 12 MiB of it, and only the first start (or a new name) needs it."""
    api = MemoryApi(time.time)
    load_or_create_serving_tls(api, "trainjob-system", [SERVICE])
    saved = tmp_path / "secret.json"
    saved.write_text(json.dumps(api.read_secret("trainjob-system", TLS_SECRET)))
    harness = os.path.join(os.path.dirname(__file__), "..", "..", "harness")
    code = ("import json, sys; from kubetest.memory_api import MemoryApi; "
            "from trainjob.backends.kubernetes.tls import load_or_create_serving_tls; "
            "import time; api = MemoryApi(time.time); secret = json.load(open(sys.argv[1])); secret.setdefault('kind', 'Secret'); "
            "secret.setdefault('apiVersion', 'v1'); api.create(secret); "
            f"load_or_create_serving_tls(api, 'trainjob-system', [{SERVICE!r}]); "
            "print(sorted(m for m in sys.modules if m.startswith('cryptography'))[:3])")
    done = subprocesses.run([sys.executable, "-c", code, str(saved)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [harness, *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
