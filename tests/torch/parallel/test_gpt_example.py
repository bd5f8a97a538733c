import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "gpt_3d.py"


def test_gpt_example_trains_under_torchrun_with_tensor_and_pipeline_parallelism(subprocesses, tmp_path):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        f"--log-dir={tmp_path}",  # not a torchelastic_* folder left in the system's /tmp
        str(EXAMPLE),
    ]
    command += ["--tp", "2", "--pp", "2", "--schedule", "ZBVZeroBubble", "--steps", "6", "--log-every", "3"]
    command += ["--dim", "32", "--batch-size", "8", "--seq-len", "32"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TP groups: [0, 1] [2, 3]" in done.stdout
    losses = [float(loss) for loss in re.findall(r"^step [36]/6 loss=([\d.]+)$", done.stdout, re.MULTILINE)]
    assert len(losses) == 2 and losses[1] < losses[0] < 5.6  # ln(256) = 5.55 at the start
    held_out = float(re.search(r"^held-out loss ([\d.]+)$", done.stdout, re.MULTILINE).group(1))
    assert held_out < 5.6
    assert re.search(r"^[\d,]+ tokens/s over \d+ steps on 4 cpu ranks$", done.stdout, re.MULTILINE)
