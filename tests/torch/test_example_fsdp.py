"""examples/fsdp_bf16.py runs under torchrun on CPU with 2 processes, learns, and writes its checkpoints."""

import re
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fsdp_bf16.py"


def test_fsdp_bf16_example_trains_with_two_processes(torchrun, tmp_path):
    proc = torchrun(EXAMPLE, "--steps", "30", "--checkpoint-dir", str(tmp_path / "ckpt"), nproc=2, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "2 processes on cpu, starting at step 0" in proc.stdout
    losses = {int(step): float(loss) for step, loss in re.findall(r"step (\d+)/30 loss=([\d.]+)", proc.stdout)}
    assert sorted(losses) == [10, 20, 30], proc.stdout  # printed once, by rank 0
    assert losses[30] < 0.6 * losses[10]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-00000020", "step-00000030"]
