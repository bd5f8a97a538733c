"""A failed job says what failed, first thing: ``node-1 rank 1: NameError: name 'lr' is not defined``, in
``trainjob run``, ``get`` and ``wait``, the SDK's ``JobFailedError`` and the TrainJob's Failed condition, whether the
job ran a script (``trainjob run``), a TrainJob from YAML (``trainjob apply``) or an SDK function."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from jobtest.local import delete_all_jobs, processes_under

from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.cli.main import main
from trainjob.errors import JobFailedError
from trainjob.sdk.client import CustomTrainer, TrainerClient
from trainjob.sdk.function_script import function_script

ROOT_CAUSE = "node-1 rank 1: NameError: name 'lr' is not defined"

# A case once seen: rank 1 raises after init_process_group, so torch prefixes its traceback and rank 0 dies of the
# lost connection, with a traceback of its own.
RAISES_AFTER_INIT = """
    import torch.distributed as dist
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        print(lr)
    dist.barrier()
"""


@pytest.fixture
def local(trainjob_home: Path):
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))
    yield backend
    delete_all_jobs(backend)
    assert processes_under(trainjob_home) == []


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_script_run_by_trainjob_run_fails_naming_rank_and_exception(local_jobs, capsys, tmp_path, local):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(RAISES_AFTER_INIT))

    code, out, err = cli(capsys, "run", str(script), "--nodes", "2", "--nproc-per-node", "1", "--name", "broken")

    assert code == 1
    assert err.strip().splitlines()[-1] == f"trainjob/broken Failed: NodeFailed: {ROOT_CAUSE}"
    assert f"Message:     {ROOT_CAUSE}" in cli(capsys, "get", "broken")[1]
    code, _, err = cli(capsys, "wait", "broken")
    assert code == 1 and err.strip() == f"error: TrainJob broken failed: NodeFailed: {ROOT_CAUSE}"
    condition = json.loads(cli(capsys, "get", "broken", "-o", "json")[1])["status"]["conditions"][0]
    assert (condition["type"], condition["message"]) == ("Failed", ROOT_CAUSE)
    # every rank's error went to its torchelastic error file, as @record would have written it
    errors = [json.loads(p.read_text()) for p in (local.store.job_dir("broken") / "logs").rglob("error.json")]
    assert "NameError: name 'lr' is not defined" in [e["message"]["message"] for e in errors]


def test_a_yaml_trainjob_fails_naming_rank_and_exception(local_jobs, capsys, tmp_path, local):
    script = tmp_path / "step.py"
    script.write_text("import os\nif os.environ['RANK'] == '1':\n    raise KeyError('shard-7')\n")
    job = tmp_path / "job.yaml"
    job.write_text(textwrap.dedent(f"""
        apiVersion: trainer.kubeflow.org/v1alpha1
        kind: TrainJob
        metadata: {{name: from-yaml}}
        spec:
          runtimeRef: {{name: torch-distributed}}
          trainer:
            numNodes: 2
            numProcPerNode: 1
            command: [torchrun, {script}]
    """))

    assert cli(capsys, "apply", "-f", str(job))[0] == 0
    with pytest.raises(JobFailedError) as failed:
        TrainerClient(LocalProcessBackendConfig(home=local.store.home)).wait_for_job_status("from-yaml", timeout=300)

    assert str(failed.value) == "TrainJob from-yaml failed: NodeFailed: node-1 rank 1: KeyError: 'shard-7'"


def raises_after_init(lr_name: str = "lr") -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise NameError(f"name {lr_name!r} is not defined")
    dist.barrier()


def test_a_function_trainer_fails_naming_rank_and_exception(local_jobs, local):
    client = TrainerClient(LocalProcessBackendConfig(home=local.store.home))
    name = client.train(trainer=CustomTrainer(func=raises_after_init, num_nodes=2, resources_per_node={"cpu": 1}))

    with pytest.raises(JobFailedError) as failed:
        client.wait_for_job_status(name, timeout=300)

    assert str(failed.value) == f"TrainJob {name} failed: NodeFailed: {ROOT_CAUSE}"
    assert client.get_job(name).message == ROOT_CAUSE


def raises(lr_name: str) -> None:
    raise NameError(f"name {lr_name!r} is not defined")


def test_a_functions_script_records_its_exception_without_trainjobs_site_hook(subprocesses, tmp_path: Path):
    """On Kubernetes nothing but the generated script runs in the pod: it writes the error file itself."""
    script = tmp_path / "train_function.py"
    script.write_text(function_script(raises, {"lr_name": "lr"}))
    error_file = tmp_path / "error.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    done = subprocess.run([sys.executable, str(script)], env={**env, "TORCHELASTIC_ERROR_FILE": str(error_file)},
                          capture_output=True, text=True, timeout=60)

    assert done.returncode == 1 and "NameError" in done.stderr
    assert json.loads(error_file.read_text())["message"]["message"] == "NameError: name 'lr' is not defined"
