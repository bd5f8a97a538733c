"""What each test cost in CPU time, its processes' included (the ranks, the local jobs' supervisors and nodes):
a pytest plugin that reads the CPU usage of the control group the session runs in.

``scripts/test.sh`` runs each of the full run's two local sessions (not the cluster tier, whose nodes place pods in
cgroups of their own) in a control group of its own when it can (root, and cgroup v2 or v1's ``cpuacct``) and
names it in ``TRAINJOB_TEST_CGROUP``; this plugin then reads the group's usage around each test and prints, with
the session's report, its CPU seconds and the tests that used the most. Every process a test starts stays in the
group (a daemon that detaches is still counted), except what a container runtime moves to cgroups of its own. The
sessions of one run are counted apart, so the figures hold while they share the cores; wall-clock durations do
not.

Without ``TRAINJOB_TEST_CGROUP`` (one session run by hand) the plugin does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

#: How many tests the report names.
SHOWN = 15


def read_usage(group: Path) -> float | None:
    """The group's CPU seconds so far: ``cpu.stat``'s ``usage_usec`` (v2) or ``cpuacct.usage`` (v1); None when
    unreadable."""
    try:
        stat = group / "cpu.stat"
        if stat.exists():
            for line in stat.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return None
        return int((group / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


class CpuReport:
    def __init__(self, group: Path) -> None:
        self.group = group
        self.start = read_usage(group)
        self.by_test: dict[str, float] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        before = read_usage(self.group)
        try:
            return (yield)
        finally:
            after = read_usage(self.group)
            if before is not None and after is not None:
                self.by_test[item.nodeid] = after - before

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        end = read_usage(self.group)
        if self.start is None or end is None:
            return
        terminalreporter.write_sep("=", f"CPU seconds of this session's processes: {end - self.start:.0f}")
        for nodeid, seconds in sorted(self.by_test.items(), key=lambda item: -item[1])[:SHOWN]:
            terminalreporter.write_line(f"{seconds:8.1f}s cpu  {nodeid}")


def register(config: pytest.Config) -> None:
    """Register the report when ``TRAINJOB_TEST_CGROUP`` names a readable control group (from ``pytest_configure``)."""
    group = os.environ.get("TRAINJOB_TEST_CGROUP")
    if group and read_usage(Path(group)) is not None:
        config.pluginmanager.register(CpuReport(Path(group)), "trainjob-cpu-report")
