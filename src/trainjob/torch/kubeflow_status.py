"""Progress updates to the status endpoint of the job's controller: Kubeflow Trainer's (its TrainJobStatus feature)
or trainjob's operator, which serves the same endpoint.

The controller gives a job's pods ``KUBEFLOW_TRAINER_SERVER_URL``, ``KUBEFLOW_TRAINER_SERVER_CA_CERT`` and
``KUBEFLOW_TRAINER_SERVER_TOKEN`` (a projected service-account token); the Kubeflow SDK's
``update_trainjob_status`` POSTs ``{"trainerStatus": {...}}`` there, at most once every 5 s. :func:`send` does the
same for :func:`trainjob.torch.metrics.update_trainjob_status` and :func:`~trainjob.torch.metrics.report`; an
update that comes sooner waits for the interval (the newest replacing older ones) and is sent at exit at the
latest, so the job's last progress arrives. An update the endpoint did not take for want of being reached (no
connection, a timeout, a 5xx answer: its operator's leader changing, say) waits the same way and is sent again,
unless a newer one replaces it; at exit it is tried for up to :data:`EXIT_RETRY_SECONDS`. One the endpoint refused
(4xx: a token or a body it does not accept) is dropped. Without the variables it does nothing (the local backend
reads the job's metrics file; an operator run without the endpoint reads node 0's log)::

    send(42, 120, {"loss": 0.43})      # False: no endpoint, or waiting for the interval, or refused
"""
from __future__ import annotations

import atexit
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

from trainjob.constants import STATUS_CA_CONFIGMAP
from trainjob.progress import MAX_METRICS, format_value

SERVER_URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_CERT_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
#: At most one update this often, as the Kubeflow SDK sends them.
MIN_INTERVAL_SECONDS = 5.0
TIMEOUT_SECONDS = 5.0
#: How long the last update is tried at exit while the endpoint cannot be reached: a little longer than an
#: operator's leader takes over (its Lease, 15 s), not so long that a job without its operator ends much later.
EXIT_RETRY_SECONDS = 20.0
#: :func:`_post`'s answer for an update to send again.
_AGAIN = "again"

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_last_sent = -MIN_INTERVAL_SECONDS
#: The newest update that came within the interval: sent when the interval has passed, or at exit.
_pending: dict[str, object] | None = None
_timer: threading.Timer | None = None
_flush_at_exit = False


def send(percent: int | None, remaining: int | None, metrics: Mapping[str, object]) -> bool:
    """POST the update to Kubeflow Trainer's status server; whether it was sent now and accepted. An update within
    :data:`MIN_INTERVAL_SECONDS` of the last one waits (replacing any older waiting one) and goes when the interval
    has passed, or when the process exits, so the last progress of a run always arrives."""
    global _last_sent, _pending
    if not os.environ.get(SERVER_URL_ENV) or not os.environ.get(TOKEN_ENV):
        return False
    status = _trainer_status(percent, remaining, metrics)
    with _lock:
        wait = _last_sent + MIN_INTERVAL_SECONDS - time.monotonic()
        if wait > 0:
            _pending = status
            _send_pending_in(wait)
            return False
        _last_sent = time.monotonic()
        _pending = None
    return _deliver(status)


def flush(retry_seconds: float = EXIT_RETRY_SECONDS) -> bool:
    """Send the waiting update now, if any (at exit, and for tests); whether one was sent and accepted. While the
    endpoint cannot be reached it is tried again, once a second, for up to ``retry_seconds``."""
    global _timer
    with _lock:
        if _timer is not None:
            _timer.cancel()
            _timer = None
    deadline = time.monotonic() + retry_seconds
    while True:
        if _send_pending():
            return True
        with _lock:
            waiting = _pending is not None
            if waiting and _timer is not None:  # kept again by the failed send: retried here instead
                _timer.cancel()
                _timer = None
        if not waiting or time.monotonic() >= deadline:
            return False
        time.sleep(1.0)


def _send_pending() -> bool:
    global _pending, _timer, _last_sent
    with _lock:
        status, _pending, _timer = _pending, None, None
        if status is None:
            return False
        _last_sent = time.monotonic()
    return _deliver(status)


def _deliver(status: dict[str, object]) -> bool:
    """POST ``status``; one that did not reach the endpoint waits to be sent again (unless a newer one came)."""
    global _pending
    outcome = _post(status)
    if outcome == _AGAIN:
        with _lock:
            if _pending is None:
                _pending = status
            _send_pending_in(MIN_INTERVAL_SECONDS)
    return outcome is True


def _send_pending_in(seconds: float) -> None:
    """With :data:`_lock` held: the waiting update goes in ``seconds`` (unless a timer is set already), or at exit."""
    global _timer, _flush_at_exit
    if _timer is None:
        _timer = threading.Timer(seconds, _send_pending)
        _timer.daemon = True
        _timer.start()
    if not _flush_at_exit:
        atexit.register(flush)
        _flush_at_exit = True


def _trainer_status(percent: int | None, remaining: int | None, metrics: Mapping[str, object]) -> dict[str, object]:
    status: dict[str, object] = {"lastUpdatedTime": datetime.now(UTC).isoformat()}
    if percent is not None:
        status["progressPercentage"] = percent
    if remaining is not None:
        status["estimatedRemainingSeconds"] = remaining
    if metrics:
        status["metrics"] = [{"name": k, "value": format_value(v)} for k, v in list(metrics.items())[:MAX_METRICS]]
    return status


def _post(status: dict[str, object]) -> bool | str:
    """``True``: accepted; ``False``: refused, or not sendable; :data:`_AGAIN`: the endpoint was not reached."""
    url, token_path = os.environ.get(SERVER_URL_ENV), os.environ.get(TOKEN_ENV)
    if not url or not token_path:
        return False
    try:
        with open(token_path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        _log.warning("cannot read the Kubeflow Trainer token %s: %s", token_path, exc)
        return False
    request = urllib.request.Request(
        url, data=json.dumps({"trainerStatus": status}).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    ca_file = os.environ.get(CA_CERT_ENV)
    if ca_file and not os.path.exists(ca_file):
        _log.warning("progress update to Kubeflow Trainer skipped: its CA %s is missing (from trainjob's operator: "
                     "ConfigMap %s of the job's namespace, made again when the operator starts)",
                     ca_file, STATUS_CA_CONFIGMAP)
        return False
    context = ssl.create_default_context(cafile=ca_file or None)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS, context=context) as response:
            return response.status == 200
    except urllib.error.HTTPError as exc:
        again = exc.code >= 500
        _log.warning("progress update to Kubeflow Trainer %s: %s", "failed, sent again later" if again else
                     "refused", exc)
        return _AGAIN if again else False
    except (urllib.error.URLError, OSError) as exc:
        _log.warning("progress update to Kubeflow Trainer failed, sent again later: %s", exc)
        return _AGAIN
