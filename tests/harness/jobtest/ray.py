"""Ray's processes on this machine, for the tests that check a Ray job leaves none behind."""

from __future__ import annotations

import re

import psutil

_RAY_PROCESS = re.compile(r"(raylet|gcs_server|ray::|ray/_private/workers|default_worker\.py|ray\.scripts\.scripts)")


def ray_processes() -> list[str]:
    """Ray's daemons and workers running on this machine now (their command lines, cut to 160 characters)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if _RAY_PROCESS.search(line):
            found.append(line[:160])
    return found
