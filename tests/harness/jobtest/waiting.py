"""Test support shared by every backend's test kit: waiting for a condition that other processes bring about.

::

    wait_until(lambda: backend.get_job("mnist").status == "Running", timeout=30, what="mnist to run")
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.05, what: str = "the condition"
) -> Any:
    """Poll ``predicate`` until it returns something truthy and return that; ``AssertionError`` naming ``what``
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
