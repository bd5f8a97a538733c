"""The operator's health probe server, on a real socket."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from trainjob.backends.kubernetes.health import HealthServer


def test_the_probe_answers_its_report_on_its_path_only() -> None:
    depth = [3]
    with HealthServer("http://127.0.0.1:0/healthz", lambda: {"queue": depth[0]}) as server:
        url = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
            assert json.loads(response.read()) == {"queue": 3}
        depth[0] = 0
        with urllib.request.urlopen(f"{url}/healthz?verbose=1", timeout=5) as response:
            assert json.loads(response.read()) == {"queue": 0}
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{url}/metrics", timeout=5)
        assert missing.value.code == 404 and b"/healthz" in missing.value.read()
    with pytest.raises(urllib.error.URLError):  # stopped: the port is closed
        urllib.request.urlopen(f"{url}/healthz", timeout=5)


def test_a_failing_report_fails_the_probe() -> None:
    def report() -> dict[str, int]:
        raise RuntimeError("the loop is stuck")

    with HealthServer("http://127.0.0.1:0/healthz", report) as server, \
            pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5)
    assert failed.value.code == 500 and b"the loop is stuck" in failed.value.read()


def test_a_liveness_url_that_is_not_http_is_refused_with_an_example() -> None:
    with pytest.raises(ValueError, match=r"not an http:// URL; expected e\.g\. http://0\.0\.0\.0:8080/healthz"):
        HealthServer("https://0.0.0.0:8080/healthz", dict)
