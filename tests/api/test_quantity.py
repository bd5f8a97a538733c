"""Kubernetes quantities: parsing, CPU / GPU counts, sums and their spelling."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainjob.api.quantity import (
    QuantityError,
    cpu_count,
    format_quantity,
    gpu_count,
    is_gpu_resource,
    parse_quantity,
    sum_quantities,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Decimal(2)),
        (8, Decimal(8)),
        (2.5, Decimal("2.5")),
        ("2.5", Decimal("2.5")),
        ("2500m", Decimal("2.5")),
        ("100u", Decimal("0.0001")),
        ("5n", Decimal("5e-9")),
        ("1k", Decimal(1000)),
        ("16Gi", Decimal(16 * 2**30)),
        ("64Gi", Decimal(64 * 2**30)),
        ("1Ki", Decimal(1024)),
        ("2M", Decimal(2 * 10**6)),
        ("1E", Decimal(10**18)),
        ("1Ei", Decimal(2**60)),
        ("1e3", Decimal(1000)),
        ("1.5E-2", Decimal("0.015")),
        (".5", Decimal("0.5")),
        ("+3", Decimal(3)),
        ("-1", Decimal(-1)),
    ],
)
def test_parse_quantity_reads_every_kubernetes_form(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", "abc", "2.5.1", "1KB", "1ki", "Gi", "1 Gi x", "e3", True, None, float("nan")]
)
def test_parse_quantity_rejects_what_kubernetes_rejects(text):
    with pytest.raises(QuantityError, match="quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1e9999", "must be at most 9.22E+18 in size, got '1e9999'"),
        ("1E+999999999", "must be at most 9.22E+18 in size, got '1E+999999999'"),
        ("9223372036854775808", "must be at most 9.22E+18 in size, got '9223372036854775808'"),
        ("8Ei", "must be at most 9.22E+18 in size, got '8Ei'"),
        (2**63, "must be at most 9.22E+18 in size, got 9223372036854775808"),
        (10**5000, "must be at most 9.22E+18 in size, got <an integer of about 5001 digits>"),
        (1e308, "must be at most 9.22E+18 in size, got 1e+308"),
        (float("inf"), "must be a finite quantity, got inf"),
        (float("nan"), "must be a finite quantity, got nan"),
        ("1" * 65, f"must be a quantity of at most 64 characters, got '{'1' * 65}'"),
        ("2\n", "must be a quantity (a number with an optional suffix: n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, "
                 "Pi, Ei or e<exponent>), got '2\\n'"),
        ("1e2.5", "must be a quantity (a number with an optional suffix: n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, "
                  "Pi, Ei or e<exponent>), got '1e2.5'"),
    ],
    ids=lambda case: case[:20] if isinstance(case, str) else type(case).__name__,
)
def test_parse_quantity_refuses_what_does_not_fit_in_64_bits(value, message):
    with pytest.raises(QuantityError) as err:
        parse_quantity(value)
    assert str(err.value) == message


@pytest.mark.parametrize(("text", "value"), [("1e-9999", Decimal("1e-100")), ("7Ei", Decimal(7 * 2**60))])
def test_parse_quantity_reads_tiny_and_largest_values(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("cpu", "count"),
    [
        ("2.5", 3),
        ("2500m", 3),
        ("0.7", 1),
        ("700m", 1),
        ("16", 16),
        (4, 4),
        ("1001m", 2),
        (None, 1),
        ("0", 1),
    ],
)
def test_cpu_count_rounds_up_with_a_floor_of_one(cpu, count):
    assert cpu_count(cpu) == count


def test_gpu_count_sums_every_gpu_resource_and_ignores_the_rest():
    assert gpu_count({"nvidia.com/gpu": 4, "amd.com/gpu": "2", "cpu": "16", "memory": "64Gi"}) == 6
    assert gpu_count({"cpu": "16"}) == 0
    assert is_gpu_resource("gpu.intel.com/i915") and not is_gpu_resource("memory")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal(64), "64"),
        (Decimal("2.5"), "2500m"),
        (Decimal(256 * 2**30), "256Gi"),
        (Decimal(2 * 10**9), "2G"),
        (Decimal(0), "0"),
        (Decimal("0.000000001"), "1n"),
    ],
)
def test_format_quantity_picks_the_shortest_exact_spelling(value, text):
    assert format_quantity(value) == text


def test_sum_quantities_multiplies_by_pod_count_and_sorts_names():
    total = sum_quantities([({"memory": "64Gi", "cpu": "2500m"}, 4), ({"cpu": "1"}, 2)])
    assert total == {"cpu": "12", "memory": "256Gi"}


_suffixes = st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ti", "n", "u"])


@given(number=st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False), suffix=_suffixes)
def test_format_then_parse_gives_back_the_same_value(number, suffix):
    value = parse_quantity(f"{number}{suffix}")
    assert parse_quantity(format_quantity(value)) == value


@given(millicores=st.integers(min_value=1, max_value=10**7))
def test_millicores_and_decimal_cpu_agree(millicores):
    as_decimal = format(Decimal(millicores) / 1000, "f")
    assert parse_quantity(f"{millicores}m") == parse_quantity(as_decimal)
    assert cpu_count(f"{millicores}m") == max(1, -(-millicores // 1000))
