"""Sizes on the tools' command lines."""

from __future__ import annotations

import pytest

from trainjob.errors import ValidationError
from trainjob.units import format_bytes, parse_bandwidth, parse_bytes, parse_count


@pytest.mark.parametrize(
    ("text", "value"),
    [("7e9", 7_000_000_000), ("7B", 7_000_000_000), ("1.3B", 1_300_000_000), ("350M", 350_000_000), (8, 8)],
)
def test_parse_count(text: str, value: int) -> None:
    assert parse_count(text, field="params") == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", 8),
        ("1K", 1024),
        ("16M", 16 << 20),
        ("80Gi", 80 << 30),
        ("40GB", 40_000_000_000),
        ("1.5KB", 1500),
    ],
)
def test_parse_bytes_follows_nccl_tests_for_bare_suffixes(text: str, value: int) -> None:
    assert parse_bytes(text, field="max_bytes") == value


@pytest.mark.parametrize(("text", "value"), [("300GB/s", 300e9), ("200Gbps", 25e9), ("900MB/s", 900e6)])
def test_parse_bandwidth(text: str, value: float) -> None:
    assert parse_bandwidth(text, field="bandwidth") == pytest.approx(value)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_count, "seven", "params: must be a number with an optional K, M, B or T suffix"),
        (parse_bytes, "16X", "params: must be a byte size such as 8, 1K, 16M, 80Gi or 40GB, got '16X'"),
        (parse_bytes, "0", "params: must be > 0, got '0'"),
        (parse_bandwidth, "300GB", "params: must be a bandwidth such as 300GB/s"),
    ],
)
def test_bad_sizes_name_the_field(parse, text: str, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValidationError) as caught:
        parse(text, field="params")
    assert str(caught.value).startswith(message)


def test_format_bytes() -> None:
    assert [format_bytes(v) for v in (512, 1.5e6, 31.40625e9)] == ["512 B", "1.50 MB", "31.41 GB"]
