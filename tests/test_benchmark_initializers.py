"""``benchmarks/initializers.py`` runs end to end at its smallest size and writes its figures (no threshold: a test
never asserts performance)."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from jobtest.tiers import starts
from objectstore.s3 import require_s3_server

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
@starts("procs")
def benchmark() -> Iterator[ModuleType]:
    """The benchmark module; its ``main`` starts the S3 server (and an initializer command)."""
    require_s3_server()
    spec = importlib.util.spec_from_file_location("benchmark_initializers", BENCHMARKS / "initializers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module


def positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def test_the_smallest_run_writes_every_ratio_and_time(benchmark: ModuleType, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures.json"
    work = tmp_path / "work"

    assert benchmark.main(["--size-mb", "2", "--runs", "1", "--json", str(out), "--work-dir", str(work)]) == 0

    figures = json.loads(out.read_text())["initializers"]
    assert figures["bytes"] == 2 * 1024 * 1024
    assert figures["runs"] == 1
    for source in ("s3", "hub"):
        for name in ("ratio", "baseline_mb_s", "trainjob_mb_s", "baseline_s", "trainjob_s"):
            assert positive(figures[source][name]), (source, name, figures[source])
    assert "skipped" in figures["aws_cli"] or positive(figures["aws_cli"]["ratio"])
    for name in ("s3_in_process_s", "hub_in_process_s", "s3_command_s", "s3_fill_s", "hub_fill_s"):
        assert positive(figures["cache_hit"][name]), (name, figures["cache_hit"])
    table = capsys.readouterr().out
    assert all(positive(figures["jobs"][name]) for name in ("plain_s", "cached_s")), figures["jobs"]
    assert "| added by the initializer |" in table
    assert "| S3 (VersityGW) | boto3 download_file" in table
    assert "huggingface_hub snapshot_download" in table
    assert list(work.iterdir()) == []  # every temporary file is gone
