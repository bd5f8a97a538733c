"""Kubernetes resource quantities: ``"2.5"``, ``"2500m"``, ``"16Gi"``, ``"1e3"``, ``8``.

A quantity is a signed decimal number followed by an optional suffix, exactly as Kubernetes accepts it, of at
most :data:`MAX_QUANTITY_CHARS` characters and at most :data:`MAX_QUANTITY` in size (Kubernetes keeps
quantities in 64 bits):

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
from decimal import Decimal

from trainjob.api.errors import quote

__all__ = [
    "MAX_QUANTITY",
    "MAX_QUANTITY_CHARS",
    "Quantity",
    "QuantityError",
    "cpu_count",
    "format_quantity",
    "gpu_count",
    "is_gpu_resource",
    "parse_quantity",
    "sum_quantities",
]

#: What a quantity looks like in YAML: a number or a string such as ``"2500m"``.
Quantity = int | float | str

#: Largest quantity (in either sign): Kubernetes keeps a quantity in an int64, 9.2E+18.
MAX_QUANTITY = Decimal(2**63 - 1)
#: Longest quantity string; the longest sensible one (``"9223372036854775807"``) has 19 characters.
MAX_QUANTITY_CHARS = 64

# fullmatch: a ``$`` would also let a trailing newline through.
_PATTERN = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE](?P<exponent>[+-]?[0-9]+))?"
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
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise QuantityError(f"must be a quantity ({ACCEPTED}), got {quote(value)}")
    if isinstance(value, int):
        return _in_range(Decimal(value) if abs(value) <= MAX_QUANTITY else None, value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"must be a finite quantity, got {quote(value)}")
        return _in_range(Decimal(repr(value)), value)
    if len(value) > MAX_QUANTITY_CHARS:
        raise QuantityError(f"must be a quantity of at most {MAX_QUANTITY_CHARS} characters, got {quote(value)}")
    match = _PATTERN.fullmatch(value)
    if match is None:
        raise QuantityError(f"must be a quantity ({ACCEPTED}), got {quote(value)}")
    number = Decimal(match["number"])
    suffix = match["suffix"]
    if not suffix:
        return _in_range(number, value)
    if suffix in _BINARY:
        return _in_range(number * _BINARY[suffix], value)
    if suffix in _DECIMAL:
        return _in_range(number * _DECIMAL[suffix], value)
    exponent = int(match["exponent"])  # at most 62 digits: the length check above
    if number and exponent + number.adjusted() > MAX_QUANTITY.adjusted():
        return _in_range(None, value)  # far too large: do not compute it
    return _in_range(number.scaleb(max(exponent, -100)), value)  # below 1e-100 is 0 for every purpose here


def _in_range(number: Decimal | None, value: Quantity) -> Decimal:
    if number is None or abs(number) > MAX_QUANTITY:
        raise QuantityError(f"must be at most {MAX_QUANTITY:.2E} in size, got {quote(value)}")
    return number


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
