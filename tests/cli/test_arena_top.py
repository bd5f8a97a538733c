"""arena habits: ``submit pytorchjob`` maps onto a TrainJob; ``top`` shows CPU, memory, GPU use and steps/s."""

from __future__ import annotations

import json
import sys
import types as pytypes
from pathlib import Path

import pytest
from jobtest.local import wait_until

from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.cli import top
from trainjob.cli.arena import parse_command
from trainjob.errors import ValidationError


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (("python train.py --epochs 2",), ("train.py", ["--epochs", "2"], False, False)),
        (("python3", "-m", "pkg.train", "--lr", "1"), ("pkg.train", ["--lr", "1"], True, False)),
        (("./train.sh 4",), ("./train.sh", ["4"], False, True)),
        (("train.py", "a"), ("train.py", ["a"], False, False)),
    ],
)
def test_arena_commands_become_run_commands(command, expected):
    assert parse_command(command) == expected


def test_torchrun_in_the_command_is_refused_with_the_fix():
    with pytest.raises(ValidationError, match="trainjob starts torchrun itself"):
        parse_command(("torchrun --nproc-per-node 2 train.py",))


def test_submit_pytorchjob_maps_arena_flags_onto_the_trainjob(local_jobs, cli, tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("import os, sys\nprint('worker', os.environ['RANK'], sys.argv[1:], flush=True)\n")
    monkeypatch.chdir(tmp_path)

    code, out, err = cli("submit", "pytorchjob", "--name", "arena", "--workers", "2", "--image", "pytorch:2.6",
                         "--data", "datasets:/data", "--env", "A=1", "--label", "team=vision", "--cpu", "1",
                         "python train.py --epochs 2")

    assert code == 0, err
    assert out.startswith("trainjob/arena created (2 node(s) x 1 process(es))")
    resource = json.loads(cli("get", "arena", "-o", "json")[1])
    trainer = resource["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"], trainer["image"]) == (2, 1, "pytorch:2.6")
    # with an image the script is the image's, as given (here the local backend runs it from the working folder)
    assert trainer["command"] == ["torchrun", "train.py"] and trainer["args"] == ["--epochs", "2"]
    assert trainer["env"] == [{"name": "A", "value": "1"}] and resource["metadata"]["labels"] == {"team": "vision"}
    assert trainer["resourcesPerNode"]["requests"] == {"cpu": "1"}
    override = resource["spec"]["podTemplateOverrides"][0]["spec"]
    assert override["volumes"] == [{"name": "data-0", "persistentVolumeClaim": {"claimName": "datasets"}}]
    assert override["containers"][0]["volumeMounts"] == [{"name": "data-0", "mountPath": "/data"}]
    code, _, err = cli("wait", "arena", "--timeout", "120")
    assert code == 0, f"{err}\n{cli('describe', 'arena')[1]}\n{cli('logs', 'arena')[1]}"
    assert "node-1/rank-1 | worker 1 ['--epochs', '2']" in cli("logs", "arena")[1]


def test_submit_help_shows_the_arena_flags(cli):
    code, out, _ = cli("submit", "pytorchjob", "--help")
    assert code == 0 and all(flag in out for flag in ("--name", "--gpus", "--workers", "--image", "--data"))
    assert "submit" in cli("--help")[1] and "top" in cli("--help")[1]


WORKER = """
import json, os, time
if os.environ["RANK"] == "0":
    with open(os.environ["TRAINJOB_METRICS_FILE"], "a") as f:
        for step in range(1, 6):
            f.write(json.dumps({"time": time.time(), "step": step * 10, "total_steps": 100, "metrics": {}}) + "\\n")
            f.flush()
            time.sleep(0.2)
print("busy", os.environ["RANK"], flush=True)
while True:
    sum(i * i for i in range(10000))
"""


def test_top_shows_jobs_nodes_and_ranks_with_cpu_memory_and_steps(local_jobs, cli, tmp_path, trainjob_home):
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))
    script = tmp_path / "busy.py"
    script.write_text(WORKER)
    assert cli("run", str(script), "--nodes", "2", "--nproc-per-node", "2", "--name", "busy", "-d")[0] == 0
    wait_until(lambda: sum("busy" in line.text for line in backend.logs("busy")) == 4, timeout=180)
    wait_until(lambda: (backend.get_job("busy").progress or None) and backend.get_job("busy").progress.step == 50,
               timeout=30)

    code, out, _ = cli("top")
    header, row = out.splitlines()[:2]
    assert code == 0 and header.split() == ["NAME", "NODESxPROCS", "CPU%", "RSS", *_gpu_columns(), "STEPS/S"]
    assert row.split()[:2] == ["busy", "2x2"] and float(row.split()[2]) > 10
    assert row.split()[3].endswith(("MiB", "GiB"))
    assert 1 < float(row.split()[-1]) < 1000
    code, out, _ = cli("top", "job", "busy")
    ranks = [line.split()[:2] for line in out.splitlines()[1:-1]]
    assert ranks == [["node-0", "agent"], ["node-0", "0"], ["node-0", "1"], ["node-1", "agent"], ["node-1", "2"],
                     ["node-1", "3"]]
    assert out.splitlines()[-1].startswith("steps/s: ")
    code, out, _ = cli("top", "node")
    assert [line.split()[:3] for line in out.splitlines()[1:]] == [["busy", "node-0", "0-1"], ["busy", "node-1", "2-3"]]
    if not top.Gpus().available:
        assert "no GPU" in out
    assert cli("top", "--backend", "kubernetes")[0] == 2


def _gpu_columns() -> list[str]:
    return ["GPU%", "GPU", "MEM"] if top.Gpus().available else ["GPU"]


def test_steps_per_second_from_the_reported_metrics():
    records = [{"time": 100.0 + i, "step": 10 * i} for i in range(100)]
    assert top.steps_per_second(records) == pytest.approx(10.0)
    assert top.steps_per_second(records[:1]) is None
    assert top.steps_per_second([{"time": 0.0, "step": 0}, {"time": 500.0, "step": 100}]) == pytest.approx(0.2)


def test_gpu_use_comes_from_nvml_when_gpus_exist(monkeypatch):
    class Process:
        def __init__(self, pid: int, used: int) -> None:
            self.pid, self.usedGpuMemory = pid, used

    fake = pytypes.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: pytypes.SimpleNamespace(gpu=[80, 40][h]),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [Process(11, 2 << 30)] if h == 0 else [Process(12, 1 << 30)],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(top.Path, "glob", lambda self, pattern: iter([Path("/dev/nvidia0")]))
    gpus = top.Gpus()
    samples = [top.Sample("j", 0, 0, 11), top.Sample("j", 0, 1, 12), top.Sample("j", 0, None, 13)]
    for sample in samples:
        gpus.fill(sample)
    assert gpus.available
    assert top._usage(samples[:1], gpus)[2:] == ["80", "2.0GiB"]
    assert top._usage(samples, gpus)[2:] == ["60", "3.0GiB"]
    assert top._usage(samples[2:], gpus)[2:] == ["-", "-"]


def test_without_gpus_top_says_no_gpu(monkeypatch):
    monkeypatch.setattr(top.Path, "glob", lambda self, pattern: iter([]))
    gpus = top.Gpus()
    assert not gpus.available and top._usage([top.Sample("j", 0, 0, 1)], gpus)[2] == "no GPU"
