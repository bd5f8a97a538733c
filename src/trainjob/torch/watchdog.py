"""Each rank's own stall watchdog on Kubernetes: a rank that stops reporting writes its Python stacks to its log.

The operator cannot signal a pod's processes, so on Kubernetes every rank watches itself. The operator sets
``TRAINJOB_STALL_DUMP`` in the job's pods (``auto``, or the seconds after which to dump: half the job's
``trainjob/stall-timeout``); a rank then counts its own calls of :func:`trainjob.torch.report` (every rank calls
it: only rank 0 records). When a rank has not reported for longer than that
(:func:`trainjob.stall_dumps.dump_after`: half the operator's own limit, so the dump is in the log before the
operator acts), it writes every thread's stack once, in :mod:`faulthandler`'s format, each line prefixed with
``[trainjob-stacks rank N]`` so that ranks writing at once stay apart. The operator reads them from the pods' logs
when it finds the job stalled and names the stuck rank (:func:`trainjob.stall_dumps.dumps_in_log`,
:func:`trainjob.backends.stacks.find_stuck_ranks`). A new report arms it again.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import threading
import time

from trainjob.constants import STALL_DUMP_ENV
from trainjob.stall_dumps import dump_after, dump_for_log

__all__ = ["beat"]


class _Watchdog:
    def __init__(self, setting: str, rank: int) -> None:
        self.setting, self.rank = setting, rank
        self.last: float | None = None
        self.longest: float | None = None
        self.dumped = False
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, name="trainjob-stall-watchdog", daemon=True).start()

    def beat(self) -> None:
        now = time.monotonic()
        with self.lock:
            if self.last is not None:
                self.longest = max(self.longest or 0.0, now - self.last)
            self.last, self.dumped = now, False

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            with self.lock:
                limit = dump_after(self.setting, self.longest)
                silent = None if self.last is None else time.monotonic() - self.last
                due = limit is not None and silent is not None and silent > limit and not self.dumped
                if due:
                    self.dumped = True
            if due and silent is not None:
                self._dump(silent)

    def _dump(self, silent: float) -> None:
        with tempfile.TemporaryFile(mode="w+") as scratch:
            faulthandler.dump_traceback(file=scratch, all_threads=True)
            scratch.seek(0)
            text = dump_for_log(self.rank, silent, scratch.read())
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed or full stderr: training goes on
            pass


_watchdog: _Watchdog | None = None


def beat() -> None:
    """A report from this rank: start the watchdog the first time (where the operator asked for it), re-arm it."""
    global _watchdog
    if _watchdog is None:
        setting = os.environ.get(STALL_DUMP_ENV)
        if not setting or setting == "off":
            return
        _watchdog = _Watchdog(setting, int(os.environ.get("RANK", "0") or 0))
    _watchdog.beat()

