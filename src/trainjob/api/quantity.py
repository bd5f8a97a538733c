"""Kubernetes resource quantities: ``"2.5"``, ``"2500m"``, ``"16Gi"``, ``"1e3"``, ``8``.

A quantity is a signed decimal number followed by an optional suffix, exactly as Kubernetes accepts it:

=============  ==============================================
suffix         multiplier
=============  ==============================================
``n u m``      10^-9, 10^-6, 10^-3
``k M G T P E``  10^3 ... 10^18
``Ki Mi Gi Ti Pi Ei``  2^10 ... 2^60
``e3``, ``E-2``  decimal exponent
=============  ==============================================

>>> parse_quantity("2500m")
Decimal('2.500')
>>> cpu_count("2.5"), cpu_count("0.7"), gpu_count({"nvidia.com/gpu": 8, "cpu": "16"})
(3, 1, 8)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

__all__ = [
    "Quantity",
    "QuantityError",
    "cpu_count",
    "effective_resources",
    "format_quantity",
    "gpu_count",
    "is_gpu_resource",
    "parse_quantity",
    "sum_quantities",
]

#: What a quantity looks like in YAML: a number or a string such as ``"2500m"``.
Quantity = int | float | str

_PATTERN = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
ACCEPTED = (
    "a number with an optional suffix: n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or e<exponent>"
)


class QuantityError(ValueError):
    """A string is not a Kubernetes quantity."""


def parse_quantity(value: Quantity) -> Decimal:
    """The exact value of a Kubernetes quantity.

    >>> parse_quantity("16Gi") == 16 * 2**30
    True

    Raises :class:`QuantityError` naming the bad value and the accepted forms.
    """
    if isinstance(value, bool):
        raise QuantityError(f"must be a quantity ({ACCEPTED}), got {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"must be a finite quantity, got {value!r}")
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"must be a quantity ({ACCEPTED}), got {value!r}")
    match = _PATTERN.match(value)
    if match is None:
        raise QuantityError(f"must be a quantity ({ACCEPTED}), got {value!r}")
    try:
        number = Decimal(match["number"])
    except InvalidOperation as exc:  # pragma: no cover - the pattern only lets decimals through
        raise QuantityError(f"must be a quantity ({ACCEPTED}), got {value!r}") from exc
    suffix = match["suffix"]
    if not suffix:
        return number
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number.scaleb(int(Decimal(suffix[1:])))


def format_quantity(value: Decimal | int) -> str:
    """The shortest exact Kubernetes spelling of ``value``: ``Decimal(10)`` -> ``"10"``, ``2.5`` -> ``"2500m"``,
    ``256 * 2**30`` -> ``"256Gi"``, ``2 * 10**9`` -> ``"2G"``."""
    value = Decimal(value)
    candidates: list[tuple[Decimal, str]] = []
    for suffix, factor in [
        ("", Decimal(1)),
        *_DECIMAL.items(),
        *((s, Decimal(f)) for s, f in _BINARY.items()),
    ]:
        mantissa = value / factor
        if mantissa == mantissa.to_integral_value():
            candidates.append((abs(mantissa), suffix))
    if not candidates:
        return format(value.normalize(), "f")
    mantissa, suffix = min(candidates, key=lambda c: c[0])
    signed = -mantissa if value < 0 else mantissa
    return f"{int(signed)}{suffix}"


def is_gpu_resource(name: str) -> bool:
    """Whether a resource name counts as GPUs: ``nvidia.com/gpu``, ``amd.com/gpu``, ``gpu.intel.com/i915`` ...

    Any extended resource whose name mentions ``gpu`` (case-insensitive) counts; ``cpu``/``memory`` never do.
    """
    return "gpu" in name.lower()


def effective_resources(
    requests: Mapping[str, Quantity] | None, limits: Mapping[str, Quantity] | None
) -> dict:
    """Per resource, the request when there is one, else the limit (Kubernetes defaults requests to limits)."""
    merged: dict[str, Quantity] = dict(limits or {})
    merged.update(requests or {})
    return merged


def cpu_count(value: Quantity | None) -> int:
    """Whole CPUs for a CPU quantity: rounded up, at least 1 (``"2.5"`` and ``"2500m"`` -> 3, ``"0.7"`` -> 1).

    ``None`` (no CPU requested) gives 1.
    """
    if value is None:
        return 1
    return max(1, math.ceil(parse_quantity(value)))


def gpu_count(resources: Mapping[str, Quantity]) -> int:
    """Total GPUs among ``resources`` (every resource :func:`is_gpu_resource` accepts), rounded up."""
    total = sum((parse_quantity(q) for name, q in resources.items() if is_gpu_resource(name)), Decimal(0))
    return math.ceil(total)


def sum_quantities(parts: list[tuple[Mapping[str, Quantity], int]]) -> dict[str, str]:
    """Sum ``count`` copies of each resource mapping: ``[({"cpu": "2"}, 4)]`` -> ``{"cpu": "8"}``."""
    totals: dict[str, Decimal] = {}
    for resources, count in parts:
        for name, quantity in resources.items():
            totals[name] = totals.get(name, Decimal(0)) + parse_quantity(quantity) * count
    return {name: format_quantity(total) for name, total in sorted(totals.items())}
