"""The README's digits DDP example under plain torchrun (as a trainjob on 2 nodes x 2 processes it is the quick
start's first job: tests/cli/test_quickstart.py checks its accuracy, progress and checkpoint)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_ddp.py"


def test_digits_example_runs_under_plain_torchrun(subprocesses, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--log-dir", str(tmp_path / "torchrun-logs"), str(EXAMPLE),
         "--epochs", "2", "--checkpoint-dir", str(tmp_path / "ckpt")],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "training on 2 processes" in result.stdout and "final test accuracy" in result.stdout
    assert (tmp_path / "ckpt" / "checkpoint.pt").is_file()
