"""Free ports for servers that bind later are taken below the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from trainjob import ports


def _range_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    return path


def test_the_listening_range_ends_below_the_ephemeral_range_and_the_nodeport_range(tmp_path):
    assert ports.listening_range(_range_file(tmp_path, "32768\t60999\n")) == range(20000, 30000)
    assert ports.listening_range(_range_file(tmp_path, "25000 60999")) == range(20000, 25000)


@pytest.mark.parametrize("text", ["1024 65535", "20500 60999", "", "not numbers"])
def test_no_listening_range_where_the_ephemeral_range_leaves_too_few_ports_or_cannot_be_read(tmp_path, text):
    assert ports.listening_range(_range_file(tmp_path, text)) is None


def test_a_free_port_is_outside_the_ephemeral_range_and_can_be_bound():
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    expected = ports.listening_range()
    for _ in range(20):
        port = ports.free_port()
        assert not low <= port <= high if expected else port > 0
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if it was not free


def test_a_port_in_use_is_never_returned(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        monkeypatch.setattr(ports, "listening_range", lambda: range(busy, busy + 1))
        port = ports.free_port()  # every try hits the bound port: the kernel's choice instead
        assert port != busy
