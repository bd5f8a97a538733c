"""Kubeflow's status endpoint, served by the operator, against the pods' own projected tokens on the test cluster.

Two jobs run a script that keeps a copy of its pod's token and CA (``KUBEFLOW_TRAINER_SERVER_TOKEN`` /
``_CA_CERT``) and waits. The test then posts as the pods would: each job's token writes its own job's
``status.trainerStatus`` and nothing else (another job's status, no token, a forged token, a malformed body are
refused with the status code and a message that says why), and while the jobs run and report the operator reads
no pod log and lists no pod of theirs. A report still waiting for the write interval when its job ends is written
with the job's ``Complete``.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubetest.cluster import TrainJobCluster, wait_for

from trainjob.backends.kubernetes.resources import CONFIGMAPS, TRAINJOBS
from trainjob.backends.kubernetes.status_server import CA_CONFIGMAP, StatusEndpoint

OPERATOR_USER = "system:serviceaccount:trainjob-system:trainjob-operator"
#: Copies the pod's token and CA next to the test, then waits for the test to say it is done.
KEEPER = """
import os, pathlib, shutil, sys, time
out = pathlib.Path(sys.argv[1])
shutil.copy(os.environ["KUBEFLOW_TRAINER_SERVER_TOKEN"], out / "token.part")
shutil.copy(os.environ["KUBEFLOW_TRAINER_SERVER_CA_CERT"], out / "ca.crt")
(out / "url").write_text(os.environ["KUBEFLOW_TRAINER_SERVER_URL"])
os.rename(out / "token.part", out / "token")
deadline = time.time() + 240
while not (out / "done").exists() and time.time() < deadline:
    time.sleep(0.2)
"""


def start(k8s: TrainJobCluster, namespace: str, name: str, tmp_path: Path) -> Path:
    out = tmp_path / name
    out.mkdir()
    k8s.create_job(name, namespace, trainer={"numNodes": 1, "command": ["python", "-c", KEEPER, str(out)],
                                             "resourcesPerNode": {"requests": {"cpu": "100m"}}})
    return out


class _ServiceConnection(http.client.HTTPSConnection):
    """HTTPS to a Service's ClusterIP, verifying the certificate for the Service's DNS name (this host has no cluster
    DNS; a pod resolves the name to the same address)."""

    def __init__(self, host: str, address: str, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def post(k8s: TrainJobCluster, url: str, ca: Path, body: Any, token: str | None) -> tuple[int, dict[str, Any]]:
    """POST ``body`` as a pod does, from this host: to the operator Service's address, TLS for its name."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    parts = urlsplit(url)
    connection = _ServiceConnection(parts.hostname or "", k8s.resolve(url), port=parts.port, timeout=20,
                                    context=ssl.create_default_context(cafile=str(ca)))
    try:
        connection.request("POST", parts.path, body=json.dumps(body).encode(), headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def report(percent: int, loss: str) -> dict[str, Any]:
    return {"trainerStatus": {"progressPercentage": percent, "estimatedRemainingSeconds": 30,
                              "metrics": [{"name": "loss", "value": loss}],
                              "lastUpdatedTime": "2026-11-24T10:00:00Z"}}


@pytest.fixture
def two_jobs(k8s: TrainJobCluster, namespace: str, tmp_path: Path) -> tuple[Path, Path]:
    a, b = start(k8s, namespace, "job-a", tmp_path), start(k8s, namespace, "job-b", tmp_path)
    try:
        wait_for(lambda: (a / "token").exists() and (b / "token").exists(), 120, "both pods to copy their token")
        yield a, b
    finally:
        for out in (a, b):
            (out / "done").touch()


def test_each_pods_token_writes_its_own_jobs_status_and_nothing_else(
    k8s: TrainJobCluster, namespace: str, two_jobs: tuple[Path, Path]
) -> None:
    a, b = two_jobs
    endpoint = StatusEndpoint(k8s.operator.status_url, "")
    url_a, url_b = endpoint.url(namespace, "job-a"), endpoint.url(namespace, "job-b")
    assert (a / "url").read_text() == url_a  # what the operator told the pod
    token_a, token_b, ca = (a / "token").read_text().strip(), (b / "token").read_text().strip(), a / "ca.crt"
    # the pods' CA is the namespace's ConfigMap, which the operator's namespace owns (uninstalling deletes it)
    shared = k8s.api.get(CONFIGMAPS, namespace, CA_CONFIGMAP)
    assert shared is not None and shared["data"] == {"ca.crt": ca.read_text()} == {"ca.crt": (b / "ca.crt").read_text()}
    assert [(o["kind"], o["name"]) for o in shared["metadata"]["ownerReferences"]] == [("Namespace", "trainjob-system")]

    def running(name: str) -> bool:
        jobs = ((k8s.api.get(TRAINJOBS, namespace, name) or {}).get("status") or {}).get("jobsStatus") or []
        return any(j.get("ready") for j in jobs)

    wait_for(lambda: running("job-a") and running("job-b"), 60, "both jobs' status to say their pod is ready")
    audit_from = len(k8s.cp.audit_requests())  # from here on, only the reports change the jobs' status

    assert post(k8s, url_a, ca, report(10, "2.5"), token_a)[0] == 200
    job = wait_for(lambda: (j := k8s.api.get(TRAINJOBS, namespace, "job-a")) and
                   (j.get("status") or {}).get("trainerStatus") and j, 30, "job-a's trainerStatus")
    assert job["status"]["trainerStatus"] == {"progressPercentage": 10, "estimatedRemainingSeconds": 30,
                                              "metrics": [{"name": "loss", "value": "2.5"}],
                                              "lastUpdatedTime": "2026-11-24T10:00:00Z"}
    # Two more reports from job-a within the interval (posted as soon as the first is seen, well inside its 5 s):
    # they wait, and only the newest is written, once the interval has passed.
    assert post(k8s, url_a, ca, report(30, "1.2"), token_a)[0] == 200
    assert post(k8s, url_a, ca, report(40, "1.1"), token_a)[0] == 200

    code, answer = post(k8s, url_b, ca, report(99, "0.1"), token_a)  # job-a's pod writing job-b's status
    assert code == 403 and f"TrainJob {namespace}/job-a, not {namespace}/job-b" in answer["message"], answer
    assert post(k8s, url_b, ca, report(20, "1.5"), token_b)[0] == 200  # job-b's own pod may
    code, answer = post(k8s, url_a, ca, report(50, "1"), None)
    assert code == 401 and "Bearer" in answer["message"], answer
    code, answer = post(k8s, url_a, ca, report(50, "1"), token_a[:-4] + "AAAA")  # a signature that does not verify
    assert code == 401 and "trainer.kubeflow.org" in answer["message"], answer
    code, answer = post(k8s, url_a, ca, {"trainerStatus": {"progressPercentage": 140}}, token_a)
    assert code == 400 and "trainerStatus.progressPercentage: must be an integer 0..100, got 140" in answer["message"]
    code, answer = post(k8s, url_a, ca, {"progress": 1}, token_a)
    assert code == 400 and '{"trainerStatus": {...}}' in answer["message"], answer
    code, answer = post(k8s, endpoint.url(namespace, "no-such-job"), ca, report(1, "1"), token_a)
    assert code == 403, answer  # the token says which job it may write; no other name, existing or not

    wait_for(lambda: ((k8s.api.get(TRAINJOBS, namespace, "job-b") or {}).get("status") or {}).get(
        "trainerStatus", {}).get("progressPercentage") == 20, 30, "job-b's trainerStatus")
    wait_for(lambda: k8s.api.get(TRAINJOBS, namespace, "job-a")["status"]["trainerStatus"]["progressPercentage"]
             == 40, 30, "job-a's newest report")

    requests = k8s.cp.audit_requests()[audit_from:]
    mine = [r for r in requests if (r.get("objectRef") or {}).get("namespace") == namespace]
    status_writes = [r for r in mine if r["objectRef"].get("resource") == "trainjobs"
                     and r["objectRef"].get("subresource") == "status"]
    progress_writes = [r for r in status_writes if r["objectRef"].get("name") == "job-a"]
    assert len(progress_writes) == 2, [r["requestURI"] for r in status_writes]  # 10%, then 40% (30% replaced)
    # the reports are stamped a day before this machine's clock (a pod on a skewed node): the stall watch goes
    # by when reports arrive, so job-a is not taken for stuck
    conditions = k8s.api.get(TRAINJOBS, namespace, "job-a")["status"].get("conditions") or []
    assert not [c for c in conditions if c["type"] == "Failed"], conditions
    assert not [r for r in mine if r["objectRef"].get("resource") == "pods" and r["verb"] == "list"]
    assert not [r for r in mine if r["objectRef"].get("subresource") == "log"]
    reviews = [r for r in requests if (r.get("objectRef") or {}).get("resource") == "tokenreviews"
               and r["user"]["username"] == OPERATOR_USER]
    # one per token (a, b, the forged one); the answers are remembered
    assert len(reviews) == 3, [(r["user"]["username"], r["stage"], r.get("responseStatus")) for r in reviews]

    # The last reports come just before the job ends, within the interval: the newest is written with the
    # condition that finishes the job, not after it (nor lost).
    assert post(k8s, url_a, ca, report(90, "0.95"), token_a)[0] == 200
    assert post(k8s, url_a, ca, report(100, "0.9"), token_a)[0] == 200
    (a / "done").touch()
    finished = k8s.wait_for_condition("job-a", "Complete", namespace=namespace, timeout=120)
    assert finished["status"]["trainerStatus"]["progressPercentage"] == 100, finished["status"]
    code, answer = post(k8s, url_a, ca, report(100, "0.9"), token_a)
    assert code == 409 and "has finished" in answer["message"], answer
