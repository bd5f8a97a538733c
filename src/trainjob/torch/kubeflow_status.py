"""Progress updates to Kubeflow Trainer's own controller, for jobs that run under it (its TrainJobStatus feature).

Kubeflow Trainer v2.2+ gives a job's pods ``KUBEFLOW_TRAINER_SERVER_URL``, ``KUBEFLOW_TRAINER_SERVER_CA_CERT`` and
``KUBEFLOW_TRAINER_SERVER_TOKEN`` (a projected service-account token); the Kubeflow SDK's
``update_trainjob_status`` POSTs ``{"trainerStatus": {...}}`` there, at most once every 5 s. :func:`send` does the
same, so a script that reports progress with :func:`trainjob.torch.metrics.update_trainjob_status` shows it on a
Kubeflow cluster too. Without the variables it does nothing (trainjob's operator reads the progress line from the
log instead)::

    send(42, 120, {"loss": 0.43})      # False: not under Kubeflow Trainer, or throttled, or refused
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime

from trainjob.progress import MAX_METRICS, format_value

SERVER_URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_CERT_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
#: At most one update this often, as the Kubeflow SDK sends them.
MIN_INTERVAL_SECONDS = 5.0
TIMEOUT_SECONDS = 5.0

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_last_sent = -MIN_INTERVAL_SECONDS


def send(percent: int | None, remaining: int | None, metrics: Mapping[str, object]) -> bool:
    """POST the update to Kubeflow Trainer's status server; whether it was accepted."""
    global _last_sent
    url = os.environ.get(SERVER_URL_ENV)
    token_path = os.environ.get(TOKEN_ENV)
    if not url or not token_path:
        return False
    with _lock:
        if time.monotonic() - _last_sent < MIN_INTERVAL_SECONDS:
            return False
        _last_sent = time.monotonic()
    try:
        with open(token_path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        _log.warning("cannot read the Kubeflow Trainer token %s: %s", token_path, exc)
        return False
    status: dict[str, object] = {"lastUpdatedTime": datetime.now(UTC).isoformat()}
    if percent is not None:
        status["progressPercentage"] = percent
    if remaining is not None:
        status["estimatedRemainingSeconds"] = remaining
    if metrics:
        status["metrics"] = [{"name": k, "value": format_value(v)} for k, v in list(metrics.items())[:MAX_METRICS]]
    request = urllib.request.Request(
        url, data=json.dumps({"trainerStatus": status}).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    ca_file = os.environ.get(CA_CERT_ENV)
    context = ssl.create_default_context(cafile=ca_file if ca_file and os.path.exists(ca_file) else None)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS, context=context) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError) as exc:
        _log.warning("progress update to Kubeflow Trainer failed: %s", exc)
        return False
