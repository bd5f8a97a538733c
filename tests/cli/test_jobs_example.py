"""The README's first job: the digits DDP example on 2 nodes x 2 processes, and the same script under torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jobtest.local import delete_all_jobs

from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_ddp.py"


def test_digits_example_reaches_95_percent_on_2_nodes_x_2_processes(local_jobs, capsys, trainjob_home):
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))
    try:
        code = main(["run", str(EXAMPLE), "--nodes", "2", "--nproc-per-node", "2", "--name", "digits",
                     "--", "--min-accuracy", "0.95"])
        out = capsys.readouterr().out
        assert code == 0, out[-2000:]
        assert "node-0/rank-0 | training on 4 processes" in out
        accuracy = float(out.split("final test accuracy ")[1].split()[0])
        assert accuracy >= 0.95
        job = backend.get_job("digits")
        assert job.progress.step == job.progress.total_steps and job.progress.metrics["loss"] < 0.5
        assert (backend.store.job_dir("digits") / "checkpoints" / "checkpoint.pt").is_file()
    finally:
        delete_all_jobs(backend)


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
