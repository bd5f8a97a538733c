"""Free TCP ports for servers that bind later (a rendezvous store, a torchrun master, a Ray head).

A port the kernel hands out for ``bind(port 0)`` comes from its ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), the same range it takes the local ports of outgoing connections from.
Between the moment a port is found free and the moment the server binds it, a busy machine (a Kubernetes control
plane, pip, a browser) can open a connection from that very port, and the server's bind then fails with
``EADDRINUSE``. Ports below the ephemeral range are never taken that way, so they are tried first, at random, each
checked by binding it; the kernel's choice is the fallback where that range is too small.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port", "is_free", "listening_range"]

LOWEST = 20000  # below: well-known and registered services' ports
TRIES = 50
_random = random.SystemRandom()


def listening_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> range | None:
    """Ports below the kernel's ephemeral range, from :data:`LOWEST`, that outgoing connections never take;
    ``None`` where the ephemeral range starts too low to leave 1,000 of them (or cannot be read)."""
    try:
        low = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    # Kubernetes' NodePort range (30000-32767) sits just below Linux's default ephemeral range: leave it out too.
    high = min(low, 30000)
    return range(LOWEST, high) if high - LOWEST >= 1000 else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing is bound to right now and no outgoing connection will take."""
    ports = listening_range()
    for _ in range(TRIES if ports else 0):
        port = _random.choice(ports)
        if is_free(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_free(host: str, port: int, reuse_address: bool = False) -> bool:
    """Whether ``port`` on ``host`` can be bound now; with ``reuse_address``, as a server setting ``SO_REUSEADDR``
    binds it (Go's listeners do), which connections left in ``TIME_WAIT`` do not stop."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
