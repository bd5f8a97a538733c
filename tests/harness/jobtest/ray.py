"""Ray's processes on this machine, for the tests that check a Ray job leaves none behind.

A test counts only the processes on its side of the network: the local backend's jobs (and plain Ray) run in this
process's network namespace; the test cluster's pods each run in their own. The two kinds of test can then run
side by side (``scripts/test.sh`` runs the cluster tier beside the others) without counting each other's Ray.
"""

from __future__ import annotations

import os
import re

import psutil

_RAY_PROCESS = re.compile(r"(raylet|gcs_server|ray::|ray/_private/workers|default_worker\.py|ray\.scripts\.scripts)")


def _network_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:  # gone, or not ours to read
        return None


def ray_processes(in_pods: bool = False) -> list[str]:
    """Ray's daemons and workers running now (their command lines, cut to 160 characters): those in this process's
    network namespace, or with ``in_pods`` those in any other (the test cluster's pods)."""
    own = _network_namespace("self")
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if not _RAY_PROCESS.search(line):
            continue
        netns = _network_namespace(process.pid)
        if netns is not None and (netns != own) == in_pods:
            found.append(line[:160])
    return found
