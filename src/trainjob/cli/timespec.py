"""Times as the CLI takes them: ``--since 5m`` (a duration back from now) or an RFC 3339 time, and back.

>>> parse_since("90s", now=1000.0)
910.0
>>> parse_since("1h30m", now=10000.0)
4600.0
>>> parse_since("2025-01-02T03:04:05Z")
1735787045.0
>>> rfc3339(1735787045.25)
'2025-01-02T03:04:05.250000Z'
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from trainjob.errors import ValidationError
from trainjob.units import duration_seconds


def parse_since(text: str, now: float | None = None) -> float:
    """The Unix time ``text`` means: ``now`` minus a duration (``30s``, ``5m``, ``2h``, ``1h30m``), or an RFC 3339
    time (``2025-01-02T03:04:05Z``); ``ValidationError`` naming ``--since`` otherwise."""
    value = text.strip()
    seconds = duration_seconds(value)
    if seconds is not None:
        return (time.time() if now is None else now) - seconds
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None or "T" not in value.upper():
        raise ValidationError(
            "--since", f"must be a duration (30s, 5m, 2h, 1h30m) or an RFC 3339 time (2025-01-02T03:04:05Z), got {text!r}"
        )
    return moment.timestamp()


def rfc3339(seconds: float | None) -> str:
    """``2025-01-02T03:04:05.250000Z`` for a Unix time; ``-`` when unknown."""
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
