"""The job commands: exit codes scripts can rely on, bad input refused with nothing created, a full job cycle."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from jobtest.local import delete_all_jobs, processes_under

from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.backends.local.supervisor import warm
from trainjob.cli.main import main

JOB_YAML = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: {name}
spec:
  runtimeRef:
    name: {runtime}
  suspend: {suspend}
  trainer:
    command: [python, -c, "import time; print('napping', flush=True); time.sleep(600)"]
"""


@pytest.fixture(autouse=True)
def no_leftovers(trainjob_home: Path) -> Iterator[None]:
    yield
    delete_all_jobs(LocalBackend(LocalProcessBackendConfig(home=trainjob_home)))
    assert processes_under(trainjob_home) == []


@pytest.fixture
def hello(tmp_path: Path) -> str:
    path = tmp_path / "hello.py"
    path.write_text("import os, sys\nprint('hello from', os.environ['RANK'], sys.argv[1:], flush=True)\n")
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def job_names(home: Path) -> list[str]:
    return [job.name for job in LocalBackend(LocalProcessBackendConfig(home=home)).list_jobs()]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


BAD_INPUT = [
    (["run", "missing.py"], "SCRIPT: no such file: missing.py"),
    (["run", "{hello}", "--env", "NOEQUALS"], "--env: must be KEY=VALUE"),
    (["apply", "-f", "{bad_yaml}"], "not valid YAML"),
    (["apply", "-f", "{unknown_runtime}"], "'nope' not found"),
    (["apply", "-f", "missing.yaml"], "-f: no such file: missing.yaml"),
    (["logs", "nobody"], "'nobody' not found"),
]
#: Refused by the API's models: by then `trainjob run` has started the job's warm supervisor, and stops it.
REFUSED_BY_THE_MODELS = [
    (["run", "{hello}", "--name", "Bad_Name"], "metadata.name"),
    (["run", "{hello}", "--name", "../outside"], "metadata.name"),
    (["run", "{hello}", "--name", "x" * 64], "metadata.name"),
    (["run", "{hello}", "--runtime", "no-such-runtime"], "'no-such-runtime' not found; known ClusterTrainingRuntimes"),
    (["run", "{hello}", "--nproc-per-node", "many"], "numProcPerNode"),
    (["run", "{hello}", "--cpu", "lots"], "cpu"),
]


def refused(capsys, tmp_path: Path, home: Path, hello: str, argv: list[str], message: str) -> None:
    """The command exits 2 with one line naming what was wrong, and nothing of a job is left."""
    files = {
        "hello": hello,
        "bad_yaml": write(tmp_path, "bad.yaml", "kind: TrainJob\nmetadata: {name: [unclosed\n"),
        "unknown_runtime": write(tmp_path, "job.yaml", JOB_YAML.format(name="ok", runtime="nope", suspend="true")),
    }
    code, out, err = run(capsys, *[arg.format(**files) for arg in argv])
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert job_names(home) == []
    assert not any((home / "jobs").iterdir()) if (home / "jobs").exists() else True


@pytest.mark.parametrize(("argv", "message"), BAD_INPUT)
def test_bad_input_exits_2_with_one_clear_line_and_creates_nothing(capsys, tmp_path, trainjob_home, hello, argv, message):
    refused(capsys, tmp_path, trainjob_home, hello, argv, message)


@pytest.mark.parametrize(("argv", "message"), REFUSED_BY_THE_MODELS)
def test_a_value_the_models_refuse_exits_2_and_the_warm_supervisor_is_stopped(
    local_jobs, capsys, tmp_path, trainjob_home, hello, argv, message
):
    started = time.time()
    refused(capsys, tmp_path, trainjob_home, hello, argv, message)
    warm_supervisors = [p for p in psutil.Process().children()
                        if warm.WARM_SUPERVISOR_FLAG in p.cmdline() and p.is_running()
                        and p.status() != psutil.STATUS_ZOMBIE]  # fmt: skip
    assert warm_supervisors == [], "the warm supervisor outlived the refused command"
    assert keepers_started_since(started - 1) == [], "a warm keeper of the warm supervisor outlived it"


def keepers_started_since(since: float) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "create_time", "status"]):
        if (process.info["create_time"] or 0) >= since and process.info["status"] != psutil.STATUS_ZOMBIE \
                and "trainjob.backends.local.node_keeper" in (process.info["cmdline"] or []):
            found.append(process)
    return found


def test_a_duplicate_name_is_refused_and_the_first_job_kept(capsys, tmp_path, trainjob_home):
    first = write(tmp_path, "first.yaml", JOB_YAML.format(name="twin", runtime="torch-distributed", suspend="true"))
    assert run(capsys, "apply", "-f", first)[0] == 0
    assert "Status:      Suspended" in run(capsys, "get", "twin")[1]  # spec.suspend: nothing starts
    assert processes_under(trainjob_home) == []
    uid = json.loads(run(capsys, "get", "twin", "-o", "json")[1])["metadata"]["uid"]

    code, _, err = run(capsys, "apply", "-f", first)

    assert code == 2 and "'twin' already exists" in err
    assert json.loads(run(capsys, "get", "twin", "-o", "json")[1])["metadata"]["uid"] == uid


def test_detached_run_then_wait_list_get_logs_events_delete(local_jobs, capsys, trainjob_home, hello):
    code, out, _ = run(capsys, "run", hello, "--nodes", "1", "--nproc-per-node", "1", "--cpu", "1", "--name", "greet",
                       "--detach", "--", "--flag", "$HOME")
    assert (code, out.strip()) == (0, "greet")
    # its supervisor is the warm one the command started while it read the job, now this job's
    supervisor = LocalBackend(LocalProcessBackendConfig(home=trainjob_home)).store.get_job("greet")["supervisor_pid"]
    assert warm.WARM_SUPERVISOR_FLAG in psutil.Process(supervisor).cmdline()

    assert run(capsys, "wait", "greet", "--timeout", "120")[:2] == (0, "trainjob/greet Complete\n")
    listing = run(capsys, "list")[1].splitlines()
    assert listing[0].split() == ["NAME", "STATUS", "NODESxPROCS", "RUNTIME", "PROGRESS", "AGE", "DURATION"]
    assert listing[1].split()[:4] == ["greet", "Complete", "1x1", "torch-distributed"]
    resource = yaml.safe_load(run(capsys, "get", "greet", "-o", "yaml")[1])
    assert resource["spec"]["trainer"]["args"] == ["--flag", "$HOME"]
    assert resource["status"]["conditions"][0]["type"] == "Complete"
    assert "Status:      Complete" in run(capsys, "get", "greet")[1]
    assert run(capsys, "logs", "greet", "--rank", "0")[1] == "node-0/rank-0 | hello from 0 ['--flag', '$HOME']\n"
    assert "ImageNotUsed" in run(capsys, "events", "greet")[1]
    code, _, err = run(capsys, "logs", "greet", "--node", "3")
    assert code == 2 and "node: must be 0..0 for TrainJob greet, got 3" in err
    assert run(capsys, "wait", "greet", "--for", "Failed")[0] == 1

    assert run(capsys, "delete", "greet")[:2] == (0, "trainjob/greet deleted\n")
    assert job_names(trainjob_home) == []


def test_a_failing_run_streams_its_logs_and_exits_1(local_jobs, capsys, tmp_path):
    script = write(tmp_path, "crash.py", "print('about to fail', flush=True)\nraise SystemExit(7)\n")

    code, out, err = run(capsys, "run", script, "--nodes", "2", "--nproc-per-node", "1", "--name", "crash")

    assert code == 1
    assert "node-0/rank-0 | about to fail" in out and "node-1/rank-1 | about to fail" in out
    assert "trainjob/crash Failed: NodeFailed: " in err and "exited with code 7" in err


def test_wait_times_out_with_exit_3_and_suspend_resume_round_trip(local_jobs, capsys, tmp_path):
    job = write(tmp_path, "nap.yaml", JOB_YAML.format(name="nap", runtime="torch-distributed", suspend="false"))
    assert run(capsys, "apply", "-f", job)[:2] == (0, "trainjob/nap created\n")

    assert run(capsys, "wait", "nap", "--timeout", "0.5")[0] == 3
    assert run(capsys, "wait", "nap", "--for", "Running", "--timeout", "30")[0] == 0
    assert run(capsys, "suspend", "nap")[:2] == (0, "trainjob/nap suspended\n")
    assert run(capsys, "list")[1].splitlines()[1].split()[1] == "Suspended"
    assert run(capsys, "resume", "nap")[:2] == (0, "trainjob/nap resumed\n")
    assert run(capsys, "wait", "nap", "--for", "Running", "--timeout", "30")[0] == 0
