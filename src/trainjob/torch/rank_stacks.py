"""Each rank's own stacks thread on Kubernetes: it writes the rank's Python stacks to its log when the rank stops
reporting, and when ``trainjob stacks NAME`` asks.

The operator cannot signal a pod's processes, so on Kubernetes every rank watches itself, on a thread of its own
(started by :func:`trainjob.torch.init` or the first :func:`trainjob.torch.report`):

- **A stall.** The operator sets ``TRAINJOB_STALL_DUMP`` in the job's pods (``off``, or the seconds after which to
  dump: half the job's ``trainjob/stall-timeout``; ``auto`` where it is absent from a pod with the status client,
  ``TRAINJOB_COLLECTIVES_URL``); a rank then counts its own calls of :func:`trainjob.torch.report`
  (every rank calls it: only rank 0 records). When a rank has not reported for longer than that
  (:func:`trainjob.log_stacks.stacks_after`: half the operator's own limit, so the dump is in the log before the
  operator acts), it writes every thread's stack once. The operator reads them from the pods' logs when it finds
  the job stalled and names the stuck rank (:func:`trainjob.log_stacks.stacks_in_log`,
  :func:`trainjob.backends.stacks.find_stuck_ranks`). A new report arms it again.
- **On request.** ``trainjob stacks NAME`` sets the pods' ``trainjob/stacks-request`` annotation to a new value;
  the kubelet writes it into the ``stacks-request`` file of the pod's status-client volume (a downward-API item, next
  to the token), which the thread reads every second. A new value there: the rank writes its stacks, headed by the
  request, and the command reads them back from the pods' logs. A request the file held for more than a minute when
  the rank started was meant for the ranks before it and is not answered.

Either way the stacks are in :mod:`faulthandler`'s format (which a thread blocked in a collective still answers,
since it holds no GIL there), each line prefixed with ``[trainjob-stacks rank N]`` so that ranks writing at once stay
apart.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import threading
import time

from trainjob.constants import COLLECTIVES_URL_ENV, STACKS_REQUEST_FILE, STALL_DUMP_ENV
from trainjob.log_stacks import stacks_after, stacks_for_log
from trainjob.torch.kubeflow_status import TOKEN_ENV

__all__ = ["beat", "start"]

CHECK_SECONDS = 1.0
#: How old a request found when the rank starts may be and still be answered (``trainjob stacks`` waits a minute).
REQUEST_FRESH_SECONDS = 60.0


class _Watchdog:
    def __init__(self, setting: str | None, rank: int, request_file: str | None) -> None:
        self.setting, self.rank, self.request_file = setting, rank, request_file
        self.last: float | None = None
        self.longest: float | None = None
        self.dumped = False
        self.lock = threading.Lock()
        # A request the kubelet wrote more than a minute before this rank started was for the ranks before it; a
        # recent one is answered (it may have come while this rank was starting).
        self.answered = self._request() if self._request_age() > REQUEST_FRESH_SECONDS else ""
        threading.Thread(target=self._watch, name="trainjob-rank-stacks", daemon=True).start()

    def beat(self) -> None:
        now = time.monotonic()
        with self.lock:
            if self.last is not None:
                self.longest = max(self.longest or 0.0, now - self.last)
            self.last, self.dumped = now, False

    def _request(self) -> str:
        """What the request file holds now ('' when there is none, or no request yet)."""
        if self.request_file is None:
            return ""
        try:
            with open(self.request_file, encoding="utf-8") as f:
                return f.read().strip()
        except OSError:
            return ""

    def _request_age(self) -> float:
        try:
            return time.time() - os.path.getmtime(self.request_file) if self.request_file else 0.0
        except OSError:
            return 0.0

    def _watch(self) -> None:
        while True:
            time.sleep(CHECK_SECONDS)
            request = self._request()
            if request and request != self.answered:
                self.answered = request
                self._dump(0.0, request)
            with self.lock:
                limit = stacks_after(self.setting, self.longest)
                silent = None if self.last is None else time.monotonic() - self.last
                due = limit is not None and silent is not None and silent > limit and not self.dumped
                if due:
                    self.dumped = True
            if due and silent is not None:
                self._dump(silent)

    def _dump(self, silent: float, request: str | None = None) -> None:
        with tempfile.TemporaryFile(mode="w+") as scratch:
            faulthandler.dump_traceback(file=scratch, all_threads=True)
            scratch.seek(0)
            text = stacks_for_log(self.rank, silent, scratch.read(), request=request)
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed or full stderr: training goes on
            pass


_watchdog: _Watchdog | None = None
_started = False


def start() -> None:
    """Start this rank's stacks thread where the operator set it up (a stall setting, or the status-client volume that
    requests arrive through); once per process, nothing elsewhere."""
    global _watchdog, _started
    if _started:
        return
    _started = True
    setting = os.environ.get(STALL_DUMP_ENV) or ("auto" if os.environ.get(COLLECTIVES_URL_ENV) else None)
    setting = None if not setting or setting == "off" else setting
    token = os.environ.get(TOKEN_ENV)
    request_file = os.path.join(os.path.dirname(token), STACKS_REQUEST_FILE) if token else None
    if request_file is not None and not os.path.exists(request_file):
        request_file = None
    if setting is None and request_file is None:
        return
    _watchdog = _Watchdog(setting, int(os.environ.get("RANK", "0") or 0), request_file)


def beat() -> None:
    """A report from this rank: start the stacks thread the first time (where the operator asked for it), re-arm it."""
    start()
    if _watchdog is not None:
        _watchdog.beat()
