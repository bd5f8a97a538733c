"""A warm keeper starts the node's warm torchrun (``node_keeper/warm_torchrun.py``): torch imported while the job
is still being created. The node it becomes is the one it would have been started as."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainjob.backends.local.node_env import warm_node_env
from trainjob.backends.local.node_keeper.warm_torchrun import (
    differences,
    relative_python_path,
    shadowed_modules,
)
from trainjob.backends.local.supervisor import nodes, warm_keepers
from trainjob.ports import free_port

# What a rank says of itself: its parent's command line (the node's process) and a variable of the node's.
RANK = """
import json, os, sys
with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], "rank.json"), "w") as f:
    json.dump({"parent": open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")[:3],
               "parent_pid": os.getppid(), "node_value": os.environ.get("TRAINJOB_TEST_VALUE"),
               "node_mark": os.environ.get("TRAINJOB_SITE_NODE_PID")}, f)
print("rank ran", flush=True)
"""


@pytest.fixture
def supervised(tmp_path: Path):
    """``tmp_path`` as a job's folder whose supervisor lock this test holds (so its keepers start no other)."""
    (tmp_path / "logs").mkdir()
    lock = os.open(tmp_path / "supervisor.lock", os.O_WRONLY | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    yield tmp_path
    warm_keepers.release_warm_keepers()
    os.close(lock)


def node_spec(job_dir: Path, argv: list[str], **env: str) -> dict:
    node_env = warm_node_env(os.environ, sys.executable)
    node_env.update({"TRAINJOB_JOB_DIR": str(job_dir), "PET_NNODES": "1", "PET_NPROC_PER_NODE": "1",
                     "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port()),
                     "PET_NODE_RANK": "0", **env})
    return {"home": str(job_dir), "name": "job", "job_dir": str(job_dir), "node": 0, "cwd": str(job_dir),
            "argv": argv, "env": node_env, "cpus": [], "log_max_bytes": 1 << 20, "mounts": []}


def run_warm_node(job_dir: Path, argv: list[str], seen: list[int] | None = None, **env: str) -> tuple[int, str]:
    """Run a node through a warm keeper (as a warm supervisor's are); its exit code and log."""
    warm_keepers.start_warm_keepers(1)
    keeper = psutil.Process(warm_keepers._warm[0].pid)
    deadline = time.monotonic() + 60
    while not keeper.children() and time.monotonic() < deadline:
        time.sleep(0.02)
    warm_torchrun = keeper.children()[0]
    assert warm_torchrun.cmdline()[1].endswith("warm_torchrun.py"), "the warm keeper starts the node's warm torchrun"
    if seen is not None:
        seen.append(warm_torchrun.pid)
    handle = nodes.NodeHandle.start(job_dir, 0, node_spec(job_dir, argv, **env))
    code = handle.popen.wait(120)
    return code, (job_dir / "logs" / "node-0.log").read_text()


def torchrun(script: Path) -> list[str]:
    # its log folder beside the script: not a torchelastic_* folder left in the system's /tmp
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "1",
            "--log-dir", str(script.parent / "torchrun-logs"), str(script)]


def test_a_torchrun_node_runs_in_the_warm_torchrun_with_the_nodes_environment(supervised, subprocesses):
    script = supervised / "rank.py"
    script.write_text(RANK)
    code, log = run_warm_node(supervised, torchrun(script), TRAINJOB_TEST_VALUE="from the job")

    assert code == 0, log
    assert "rank ran" in log
    rank = json.loads((supervised / "rank.json").read_text())
    assert rank["parent"][1].endswith("warm_torchrun.py"), "torchrun ran in the warm torchrun that imported it"
    assert "Traceback" not in log
    assert rank["node_value"] == "from the job"
    assert rank["node_mark"] == str(rank["parent_pid"]), "the node's sitecustomize set it up as a node's torchrun"
    assert "RuntimeWarning" not in log


def test_a_node_whose_python_settings_differ_is_started_cold_with_the_same_pid(supervised, subprocesses):
    script = supervised / "rank.py"
    script.write_text(RANK)
    keeper_children = []
    code, log = run_warm_node(supervised, torchrun(script), PYTHONHASHSEED="7", TRAINJOB_TEST_VALUE="cold",
                               seen=keeper_children)

    assert code == 0, log
    rank = json.loads((supervised / "rank.json").read_text())
    assert rank["parent"] == torchrun(script)[:3], "exec'd as the command it is: a fresh Python reads PYTHONHASHSEED"
    assert rank["parent_pid"] == keeper_children[0], "the warm torchrun's pid: the process the keeper watches"
    assert rank["node_value"] == "cold"


def test_a_command_that_is_not_torchrun_is_executed_as_it_is(supervised, subprocesses):
    code, log = run_warm_node(supervised, ["sh", "-c", 'echo "plain $NODE_VALUE"; exit 3'], NODE_VALUE="node")

    assert code == 3
    assert "plain node" in log


def test_a_command_that_cannot_start_says_why_in_the_nodes_log(supervised, subprocesses):
    code, log = run_warm_node(supervised, ["no-such-command-here", "--flag"])

    assert code == 127
    assert "[trainjob] cannot start node-0: [Errno 2] No such file or directory: 'no-such-command-here'" in log


def test_a_released_warm_supervisor_leaves_no_warm_torchrun_behind(subprocesses):
    from trainjob.backends.local.supervisor import warm

    def kinds(processes: list[psutil.Process]) -> list[str]:
        # a warm torchrun between its fork and its exec still shows its keeper's command line
        return sorted("keeper" if "--warm" in p.cmdline() else p.cmdline()[1].rsplit("/", 1)[-1] for p in processes)

    warm.start(nodes=2)
    try:
        supervisor = psutil.Process(warm._warm.pid)
        deadline = time.monotonic() + 60
        below = supervisor.children(recursive=True)
        while kinds(below) != ["keeper", "keeper", "warm_torchrun.py", "warm_torchrun.py"] and time.monotonic() < deadline:
            time.sleep(0.05)
            below = supervisor.children(recursive=True)
        assert kinds(below) == ["keeper", "keeper", "warm_torchrun.py", "warm_torchrun.py"]
    finally:
        warm.release()  # whatever happened: a warm supervisor left running would be blamed on the tests after this one

    gone, alive = psutil.wait_procs(below, timeout=30)
    assert alive == [], "a warm keeper or warm torchrun outlived its warm supervisor"


def test_only_what_a_node_sets_for_torchrun_may_differ_from_the_warm_torchruns_start():
    started = {"HOME": "/home/a", "PATH": "/bin", "PYTHONPATH": "/site"}
    assert differences(started, {**started, "PET_NNODES": "2", "OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "1",
                                 "NCCL_DEBUG": "INFO", "TRAINJOB_JOB_DIR": "/j", "TORCHELASTIC_ERROR_FILE": "/e",
                                 "MASTER_PORT": "1"}) == []
    assert differences(started, {**started, "LD_PRELOAD": "/x.so", "LOGLEVEL": "INFO", "EPOCHS": "3"}) == [
        "EPOCHS", "LD_PRELOAD", "LOGLEVEL"]
    assert differences(started, {"PATH": "/bin"}) == ["HOME", "PYTHONPATH"], "removed ones count"
    assert differences({}, {"TRAINJOB_SITE_NODE_PID": "9"}) == ["TRAINJOB_SITE_NODE_PID"]
    assert not relative_python_path({"PYTHONPATH": "/a:/b"}) and not relative_python_path({})
    assert relative_python_path({"PYTHONPATH": "/a:src"}) and relative_python_path({"PYTHONPATH": "/a::/b"})


def test_a_job_variable_torch_reads_as_it_imports_starts_the_node_cold(supervised, subprocesses):
    script = supervised / "rank.py"
    script.write_text(RANK)
    code, log = run_warm_node(supervised, torchrun(script), LOGLEVEL="INFO")

    assert code == 0, log
    rank = json.loads((supervised / "rank.json").read_text())
    assert rank["parent"] == torchrun(script)[:3], "torch's loggers take their level from LOGLEVEL as they are made"


def test_a_module_already_imported_that_the_nodes_folder_would_shadow_is_named(tmp_path):
    (tmp_path / "json.py").write_text("")
    (tmp_path / "train.py").write_text("")
    (tmp_path / "data").mkdir()
    assert shadowed_modules(str(tmp_path)) == ["json"]
    assert shadowed_modules(str(tmp_path / "missing")) == ["?"]
