"""Fixtures for trainjob.torch tests: a one-process group in the test process, and a torchrun launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from jobtest.tiers import starts
from jobtest.waiting import run_held_to_runnable_time

from trainjob.torch.testing import free_port


@pytest.fixture
def single_process() -> Iterator[object]:
    """trainjob.torch.init() without torchrun's environment (a group of one), shut down afterwards."""
    import trainjob.torch as tt

    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE") if k in os.environ}
    ctx = tt.init()
    yield ctx
    tt.shutdown()
    os.environ.update(saved)


@pytest.fixture
@starts("procs")
def torchrun(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``torchrun --standalone --nproc-per-node=N script args...`` on this machine and capture its output."""

    def run(script: Path, *args: str, nproc: int = 2, max_restarts: int = 0, env: dict[str, str] | None = None,
            timeout: float = 150) -> subprocess.CompletedProcess[str]:
        command = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes=1", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            f"--max-restarts={max_restarts}", "--monitor-interval=0.2",
            f"--log-dir={tmp_path / 'torchrun-logs'}",  # not a torchelastic_* folder left in the system's /tmp
            str(script), *args,
        ]  # fmt: skip
        full_env = {
            **os.environ,
            # this environment's bin first, as in an activated virtual environment and in a job's nodes: the
            # tools a run finds there (DeepSpeed's JIT builds call ninja) are the ones its jobs find
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
            "OMP_NUM_THREADS": "1",
            # A restarted worker group must not find the previous attempt's gloo addresses in a shared store.
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            **(env or {}),
        }
        # The limit guards against a hang: time the job's processes only waited for a CPU does not count.
        return run_held_to_runnable_time(command, timeout, cwd=tmp_path, env=full_env)

    return run
