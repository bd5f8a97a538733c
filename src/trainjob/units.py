"""Parse and print sizes: parameter counts, byte sizes, bandwidths (tool command lines, checkpoint messages),
and durations.

>>> parse_count("7e9", field="params"), parse_count("175B", field="params")
(7000000000, 175000000000)
>>> parse_bytes("16M", field="max_bytes"), parse_bytes("80Gi", field="gpu_memory"), parse_bytes("40GB", field="x")
(16777216, 85899345920, 40000000000)
>>> parse_bandwidth("300GB/s", field="bandwidth"), parse_bandwidth("200Gbps", field="bandwidth")
(300000000000.0, 25000000000.0)
>>> format_bytes(31.40625e9)
'31.41 GB'
>>> duration_seconds("1h30m"), duration_seconds("90s"), duration_seconds("600"), duration_seconds("")
(5400.0, 90.0, None, None)

Byte sizes follow nccl-tests: a bare ``K``, ``M``, ``G`` is a power of 1024 (``-b 8 -e 128M``); ``Ki``/``Mi``/``Gi``
(Kubernetes) are too, while ``KB``, ``MB``, ``GB``, ``TB`` are powers of 1000. Parameter counts take ``K``, ``M``,
``B`` (billion), ``T`` or a plain number (``7e9``).
"""

from __future__ import annotations

import re

from trainjob.errors import ValidationError

__all__ = ["duration_seconds", "format_bytes", "format_seconds", "parse_bandwidth", "parse_bytes", "parse_count"]

_NUMBER = r"(?P<number>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+)"
_COUNT = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_BYTES = {
    "": 1, "B": 1,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
    "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
}  # fmt: skip
_DURATION = re.compile(r"^(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?$")
_BANDWIDTH = {"GB/s": 1e9, "MB/s": 1e6, "TB/s": 1e12, "Gbps": 1e9 / 8, "Gb/s": 1e9 / 8, "Mbps": 1e6 / 8}


def _parse(text: str | int | float, units: dict[str, float], field: str, accepted: str) -> float:
    if isinstance(text, int | float):
        value, unit = float(text), ""
    else:
        match = re.fullmatch(_NUMBER + r"\s*(?P<unit>[A-Za-z/]*)", text.strip())
        if match is None or match["unit"] not in units:
            raise ValidationError(field, f"must be {accepted}, got {text!r}")
        value, unit = float(match["number"]), match["unit"]
    if value <= 0:
        raise ValidationError(field, f"must be > 0, got {text!r}")
    return value * units[unit]


def parse_count(text: str | int | float, *, field: str) -> int:
    """A positive count such as ``7e9``, ``7B``, ``1.3B`` or ``350M``."""
    return round(_parse(text, _COUNT, field, "a number with an optional K, M, B or T suffix (7e9, 7B, 350M)"))


def parse_bytes(text: str | int | float, *, field: str) -> int:
    """A positive byte size: ``1K`` = 1024 (nccl-tests), ``80Gi``, ``40GB`` = 40e9."""
    return round(_parse(text, _BYTES, field, "a byte size such as 8, 1K, 16M, 80Gi or 40GB"))


def parse_bandwidth(text: str | int | float, *, field: str) -> float:
    """Bytes per second from ``300GB/s``, ``25GB/s`` or ``200Gbps`` (bits)."""
    return _parse(text, _BANDWIDTH, field, "a bandwidth such as 300GB/s, 900MB/s or 200Gbps")


def duration_seconds(text: str) -> float | None:
    """Seconds of a duration written with units, ``90s``, ``10m``, ``2h`` or ``1h30m``; ``None`` when ``text`` is
    not one (a bare number included: whether that means seconds is the caller's to say)."""
    match = _DURATION.match(text)
    if not text or match is None or not any(match.groupdict().values()):
        return None
    return sum(float(match[unit] or 0) * factor for unit, factor in (("h", 3600), ("m", 60), ("s", 1)))


def format_bytes(value: float) -> str:
    """``31406250000`` -> ``'31.41 GB'`` (powers of 1000, like the seeds' tables)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def format_seconds(value: float) -> str:
    """``0.0123`` -> ``'12.30 ms'``."""
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.2f} ms"
    return f"{value * 1e6:.1f} us"
