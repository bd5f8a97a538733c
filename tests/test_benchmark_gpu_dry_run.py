"""The GPU benchmark's dry run (benchmarks/gpu/run.py --dry-run): every step runs on the CPU and none fails."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "benchmarks" / "gpu" / "run.py"
STEPS = ("env", "throughput", "collectives", "checkpoint", "planner")


def test_gpu_budgets_fit_in_seven_minutes() -> None:
    spec = importlib.util.spec_from_file_location("gpu_bench_run", RUN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    assert sum(module.config(False, None).budgets.values()) <= 420


def test_dry_run_passes_every_step(subprocesses: Any, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocesses.run([sys.executable, str(RUN), "--dry-run", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=240, env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "gpu-results.json").read_text())
    assert report["dry_run"] is True
    for step in STEPS:
        result = report["results"][step]
        assert result["status"] in ("ok", "skipped"), (step, result)
        if result["status"] == "skipped":
            assert result.get("reason"), (step, result)
    variants = report["results"]["throughput"]["variants"]
    for name, variant in variants.items():
        assert variant["status"] in ("ok", "skipped"), (name, variant)
    assert variants["compile"]["status"] == "skipped" and variants["compile"]["reason"]
    assert variants["eager"]["tokens_per_s"] > 0 and variants["plain"]["tokens_per_s"] > 0
    assert report["results"]["throughput"]["torchtitan"]["reason"]
    markdown = (tmp_path / "gpu-results.md").read_text()
    assert all(f"## {step}: ok" in markdown for step in STEPS)
