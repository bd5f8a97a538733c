"""Local nodes get what a pod would of the environment a job is created from, not the caller's whole shell;
``inherit_env`` / ``--inherit-env`` opts in, and an event names what was (or was not) passed, never a value."""

from __future__ import annotations

import json
import os
from pathlib import Path

from jobtest.local import trainjob_resource

from trainjob.backends.local import process_specs
from trainjob.backends.local.worker_site import SITE_DIR
from trainjob.cli.main import main

CALLER = {
    "PATH": "/usr/bin", "HOME": "/home/me", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "VIRTUAL_ENV": "/venv",
    "TRAINJOB_HOME": "/th", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "64", "AWS_SECRET_ACCESS_KEY": "hunter2",
    "RANK": "3", "PET_NNODES": "4", "TORCHELASTIC_RUN_ID": "outer",
}


def test_a_node_gets_what_a_pod_would_plus_what_python_needs():
    assert process_specs.passed_env(CALLER) == {
        "PATH": "/usr/bin", "HOME": "/home/me", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "VIRTUAL_ENV": "/venv",
        "TRAINJOB_HOME": "/th",
    }


def test_inheriting_passes_everything_but_an_outer_launchers_variables():
    inherited = process_specs.passed_env(CALLER, inherit_env=True)
    assert inherited["NCCL_DEBUG"] == "INFO" and inherited["AWS_SECRET_ACCESS_KEY"] == "hunter2"
    assert not {"RANK", "PET_NNODES", "TORCHELASTIC_RUN_ID"} & set(inherited)


def test_events_name_variables_never_values():
    reason, message = process_specs.environment_note(CALLER, inherit_env=False)
    assert reason == "EnvironmentNotInherited"
    assert "NCCL_DEBUG, OMP_NUM_THREADS" in message and "--inherit-env" in message
    assert "AWS_SECRET_ACCESS_KEY" not in message, "only settings that change training are pointed out"
    reason, message = process_specs.environment_note(CALLER, inherit_env=True)
    assert reason == "EnvironmentInherited"
    assert "AWS_SECRET_ACCESS_KEY, NCCL_DEBUG, OMP_NUM_THREADS" in message
    assert "hunter2" not in message and "INFO" not in message
    assert process_specs.environment_note({"PATH": "/bin"}, inherit_env=False) is None


def test_the_worker_site_leads_pythonpath_and_the_callers_path_follows():
    node = process_specs.NodeProcessSpec(index=0, command=["python", "x.py"], env={})
    env = process_specs.node_environment(node, 29500, "/venv/bin/python", base_env={"PYTHONPATH": "/mine"})
    assert env["PYTHONPATH"] == os.pathsep.join([SITE_DIR, "/mine"])
    assert env["PATH"].startswith("/venv/bin")


SHOW_ENV = """
import json, os
names = ["NCCL_DEBUG", "MY_TOKEN", "HOME", "PATH", "LANG"]
with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], "env.json"), "w") as f:
    json.dump({name: os.environ.get(name) for name in names}, f)
"""


def seen_env(backend, name: str) -> dict[str, str | None]:
    backend.wait_for_job_status(name, timeout=120)
    return json.loads((backend.store.job_dir(name) / "env.json").read_text())


def test_a_local_job_does_not_inherit_the_callers_exports_unless_asked(backend, script, monkeypatch):
    show = script("show_env.py", SHOW_ENV)
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("MY_TOKEN", "hunter2")
    monkeypatch.setenv("LANG", "C.UTF-8")

    backend.apply(trainjob_resource("isolated", ["python", show]))
    backend.apply(trainjob_resource("inheriting", ["python", show]), inherit_env=True)

    isolated, inheriting = seen_env(backend, "isolated"), seen_env(backend, "inheriting")
    assert (isolated["NCCL_DEBUG"], isolated["MY_TOKEN"]) == (None, None)
    assert (isolated["HOME"], isolated["LANG"]) == (os.environ["HOME"], "C.UTF-8")
    assert (inheriting["NCCL_DEBUG"], inheriting["MY_TOKEN"]) == ("INFO", "hunter2")
    events = {e.reason: e.message for e in backend.get_job_events("inheriting")}
    assert "MY_TOKEN" in events["EnvironmentInherited"] and "hunter2" not in events["EnvironmentInherited"]
    assert "NCCL_DEBUG" in {e.reason: e.message for e in backend.get_job_events("isolated")}["EnvironmentNotInherited"]


def test_inherit_env_is_a_flag_of_run_and_apply_for_local_jobs(backend, script, monkeypatch, capsys, tmp_path: Path):
    show = script("show_env.py", SHOW_ENV)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    job = tmp_path / "job.yaml"
    job.write_text(f"apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {{name: applied}}\n"
                   f"spec:\n  runtimeRef: {{name: torch-distributed}}\n  trainer: {{command: [python, {show}]}}\n")

    assert main(["run", show, "--name", "ran", "--nproc-per-node", "1", "--inherit-env", "-d"]) == 0
    assert main(["apply", "-f", str(job), "--inherit-env"]) == 0

    assert seen_env(backend, "ran")["NCCL_DEBUG"] == "WARN"
    assert seen_env(backend, "applied")["NCCL_DEBUG"] == "WARN"
    capsys.readouterr()
    code = main(["apply", "-f", str(job), "--inherit-env", "--backend", "kubernetes"])
    assert code == 2 and "--inherit-env: applies to local jobs only" in capsys.readouterr().err
