"""The ``ray-distributed`` runtime: its plan (no process), then real Ray jobs on this machine (``procs``).

The job tests run seed 003's Ray Train script (examples/ray/ray_train.py) on 2 nodes, and the same script under
plain Ray in the same test. Skipped when Ray is not installed (``pip install 'trainjob[ray]'``), unless
``TRAINJOB_REQUIRE_RAY`` is set: then a missing Ray fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from jobtest.local import trainjob_resource, wait_until
from jobtest.ray import ray_processes
from jobtest.tiers import starts

from trainjob.errors import ValidationError
from trainjob.ray_storage import storage_paths, storage_problem
from trainjob.runtime import builtin_runtimes, resolve
from trainjob.runtime.plugins.ray import HEAD_PORT

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(
    not HAVE_RAY and not os.environ.get("TRAINJOB_REQUIRE_RAY"),
    reason="Ray is not installed (pip install 'trainjob[ray]'); TRAINJOB_REQUIRE_RAY=1 makes this a failure",
)
ROOT = Path(__file__).resolve().parents[2]
SEED_SCRIPT = ROOT / "examples" / "ray" / "ray_train.py"
FAILING_SCRIPT = Path(__file__).with_name("failing_train.py")
EPOCHS = 5
JOB_TIMEOUT = 420


def _plan(name: str = "rt", **trainer):
    job = trainjob_resource(name, trainer.pop("command", ["python", "ray_train.py"]), runtime="ray-distributed",
                            **trainer)
    return resolve(job, builtin_runtimes()["ray-distributed"])


def test_every_node_runs_the_ray_node_with_the_driver_and_node_0_as_head():
    plan = _plan(num_nodes=3, command=["python", "ray_train.py"], args=["--epochs", "2"])
    container = plan.trainer().container("node")
    env = {var.name: var.value for var in container.env}
    assert (plan.ml_policy, plan.num_nodes, plan.trainer().count) == ("ray", 3, 3)
    assert container.command == ["python", "-m", "trainjob.ray.node"]
    assert container.args == ["python", "ray_train.py", "--epochs", "2"]
    assert env["PET_MASTER_ADDR"] == "rt-node-0-0.rt" == plan.master_addr()
    assert (env["PET_MASTER_PORT"], env["PET_NNODES"]) == (str(HEAD_PORT), "3")
    assert [p.container_port for p in container.ports] == [HEAD_PORT]
    assert "plainml" not in plan.plugins and "ray" in plan.plugins


def test_the_nodes_offer_ray_the_cpus_and_gpus_they_request():
    plan = _plan(num_nodes=2, resources_per_node={"requests": {"cpu": "3", "nvidia.com/gpu": "1"}})
    env = {var.name: var.value for var in plan.trainer().container("node").env}
    assert (env["TRAINJOB_RAY_NUM_CPUS"], env["TRAINJOB_RAY_NUM_GPUS"]) == ("3", "1")


@pytest.mark.parametrize(("trainer", "field", "words"), [
    ({"command": []}, "spec.trainer.command", "runs a driver script on node 0"),
    ({"num_proc_per_node": 2}, "spec.trainer.numProcPerNode", "ScalingConfig(num_workers"),
])
def test_a_ray_job_without_a_driver_or_with_torch_settings_is_refused(trainer, field, words):
    with pytest.raises(ValidationError) as caught:
        _plan(**trainer)
    assert field in str(caught.value) and words in str(caught.value)


def test_storage_paths_are_read_from_the_driver_script(tmp_path: Path):
    script = tmp_path / "drive.py"
    script.write_text("RunConfig(name='x', storage_path='s3://bucket/runs')\nf(storage_path=computed)\n")
    assert storage_paths(script) == ["s3://bucket/runs"]
    assert storage_problem("/mnt/shared/ray_results") is None
    assert "scheme 'hdfs' is not supported" in (storage_problem("hdfs://nn/runs") or "")


@pytest.fixture
@starts("procs")
def python_without_pyarrow() -> str:
    """An interpreter of this machine that has no pyarrow (Debian's python3), or a skip."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(candidate).exists() and os.system(f"{candidate} -c 'import pyarrow' 2>/dev/null") != 0:
            return candidate
    pytest.skip("no Python without pyarrow on this machine")


def test_s3_storage_without_pyarrow_is_refused_naming_what_to_install(python_without_pyarrow: str):
    problem = storage_problem("s3://bucket/runs", python=python_without_pyarrow)
    assert problem is not None and "pyarrow._s3fs" in problem and "pip install 'trainjob[ray]'" in problem
    assert storage_problem("/tmp/ray_results", python=python_without_pyarrow) is None


# Real Ray jobs.


def _final_loss(output: str) -> float:
    return float(re.findall(r"final loss ([0-9.]+)", output)[-1])


@needs_ray
@pytest.mark.timeout(900)
def test_seed_ray_train_script_on_two_nodes_completes_reports_and_trains_like_plain_ray(
    local_jobs, subprocesses, tmp_path: Path
):
    assert not ray_processes(), "Ray is already running in this network namespace; this test counts Ray's processes"
    plain_storage, job_storage = tmp_path / "plain", tmp_path / "job"
    # plain Ray's session folder: a short path of the test's own (its sockets allow 107 bytes), not /tmp/ray
    ray_tmp = Path(tempfile.mkdtemp(prefix="tjr"))
    env = {**os.environ, "EPOCHS": str(EPOCHS), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "RAY_TMPDIR": str(ray_tmp)}
    env.pop("RAY_ADDRESS", None)
    try:
        plain = subprocesses.run([sys.executable, str(SEED_SCRIPT), str(plain_storage)], env=env, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=JOB_TIMEOUT)
        assert plain.returncode == 0, plain.stderr[-3000:]
        wait_until(lambda: not ray_processes(), timeout=30)  # plain Ray stops its own cluster as the driver exits
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

    job = trainjob_resource("ray-seed", ["python", str(SEED_SCRIPT), str(job_storage)], runtime="ray-distributed",
                            num_nodes=2, env=[{"name": "EPOCHS", "value": str(EPOCHS)}])
    local_jobs.apply(job)
    wait_until(lambda: local_jobs.get_job("ray-seed").status in ("Complete", "Failed"), timeout=JOB_TIMEOUT)
    done = local_jobs.get_job("ray-seed")
    log = "\n".join(local_jobs.get_job_logs("ray-seed", follow=False))
    assert done.status == "Complete", f"{done.reason}: {done.message}\n{log[-3000:]}"
    assert done.num_nodes == 2 and done.restarts == 0
    # train.report's loss is the job's progress, one step per report
    assert done.progress is not None and done.progress.step == EPOCHS
    assert done.progress.metrics["loss"] == pytest.approx(_final_loss(log), rel=1e-4)
    assert "step 1 loss=" in log
    # Ray kept 3 of the 5 checkpoints it saved, in both runs
    for storage in (plain_storage, job_storage):
        assert len([p for p in (storage / "my-training").glob("checkpoint_*") if p.is_dir()]) == 3
    snapshot = json.loads((job_storage / "my-training" / "checkpoint_manager_snapshot.json").read_text())
    assert snapshot  # Ray's own record of what it kept
    # the same training as under plain Ray
    print(f"final loss: trainjob {_final_loss(log)}, plain ray {_final_loss(plain.stdout)}; reports {done.progress.step}")
    assert _final_loss(log) == pytest.approx(_final_loss(plain.stdout), rel=1e-3)
    wait_until(lambda: not ray_processes(), timeout=30)


@needs_ray
@pytest.mark.timeout(900)
def test_a_failing_train_func_fails_the_job_with_rays_error_after_rays_own_restarts(local_jobs, tmp_path: Path):
    attempts = tmp_path / "attempts.txt"
    job = trainjob_resource("ray-fails", ["python", str(FAILING_SCRIPT), str(attempts), str(tmp_path / "runs")],
                            runtime="ray-distributed", num_nodes=2)
    local_jobs.apply(job)
    wait_until(lambda: local_jobs.get_job("ray-fails").status in ("Complete", "Failed"), timeout=JOB_TIMEOUT)
    done = local_jobs.get_job("ray-fails")
    log = "\n".join(local_jobs.get_job_logs("ray-fails", follow=False))
    assert done.status == "Failed", log[-3000:]
    assert "the loss went to 42" in (done.message or ""), f"{done.message}\n{log[-4000:]}"
    assert "ValueError" in (done.message or "")
    # FailureConfig(max_failures=1): Ray ran train_func twice; trainjob restarted nothing
    assert attempts.read_text().count("attempt") == 2
    assert done.restarts == 0
    wait_until(lambda: not ray_processes(), timeout=30)


def test_ray_imports_in_the_interpreter_the_jobs_use():
    """With TRAINJOB_REQUIRE_RAY set and Ray missing, this is the test that says so."""
    if not HAVE_RAY and not os.environ.get("TRAINJOB_REQUIRE_RAY"):
        pytest.skip("Ray is not installed (pip install 'trainjob[ray]')")
    assert HAVE_RAY, f"Ray is not importable by {sys.executable}"
