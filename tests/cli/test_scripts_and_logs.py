"""Scripts of every kind (-m, --no-python, a missing script caught at submit) and logs as kubectl shows them."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from jobtest.local import processes_under, trainjob_resource, wait_until

from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.errors import ValidationError


@pytest.fixture
def backend(trainjob_home: Path) -> LocalBackend:
    return LocalBackend(LocalProcessBackendConfig(home=trainjob_home))


def test_run_m_runs_a_module_from_the_working_directory(local_jobs, cli, tmp_path, monkeypatch):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("import os, sys\nprint('module rank', os.environ['RANK'], sys.argv[1:])\n")
    monkeypatch.chdir(tmp_path)

    code, out, err = cli("run", "-m", "mypkg.train", "--nodes", "2", "--name", "mod", "--", "--lr", "1")

    assert code == 0, err
    assert "node-0/rank-0 | module rank 0 ['--lr', '1']" in out and "node-1/rank-1 | module rank 1" in out
    assert cli("get", "mod", "-o", "json")[1].count('"-m"') == 1


def test_run_no_python_runs_a_shell_script(local_jobs, cli, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\necho \"shell rank $RANK of $WORLD_SIZE args $*\"\n")
    script.chmod(0o755)

    code, out, err = cli("run", "--no-python", str(script), "--nodes", "2", "--name", "sh", "--", "a")

    assert code == 0, err
    assert "node-1/rank-1 | shell rank 1 of 2 args a" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "-m", "no_such_pkg.train"], "MODULE: the module no_such_pkg.train cannot be found"),
        (["run", "-m", "not a module"], "is not a Python module name"),
        (["run", "--no-python", "{plain}"], "is not executable; chmod +x"),
        (["run", "--no-python", "no-such-program-xyz"], "no such file or program on PATH"),
        (["run", "-m", "x", "--no-python"], "-m: cannot be combined with --no-python"),
        (["run", "train"], "SCRIPT: no such file: train (a module? use -m"),
    ],
)
def test_run_refuses_what_it_cannot_start(cli, tmp_path, argv, message, trainjob_home):
    plain = tmp_path / "plain.sh"
    plain.write_text("echo hi\n")
    code, _, err = cli(*[a.format(plain=plain) for a in argv])
    assert code == 2 and message in err, err
    assert not (trainjob_home / "jobs").exists() or not any((trainjob_home / "jobs").iterdir())


def test_apply_of_a_command_naming_a_missing_script_starts_nothing(cli, tmp_path, backend, trainjob_home):
    good = tmp_path / "good.py"
    good.write_text("print('fine')\n")
    (tmp_path / "jobs.yaml").write_text(textwrap.dedent(f"""
        apiVersion: trainer.kubeflow.org/v1alpha1
        kind: TrainJob
        metadata: {{name: first}}
        spec: {{runtimeRef: {{name: torch-distributed}}, trainer: {{command: [torchrun, {good}]}}}}
        ---
        apiVersion: trainer.kubeflow.org/v1alpha1
        kind: TrainJob
        metadata: {{name: second}}
        spec:
          runtimeRef: {{name: torch-distributed}}
          trainer: {{command: [torchrun, --nproc-per-node, "2", trian.py, --epochs, "3"]}}
    """))

    code, _, err = cli("apply", "-f", str(tmp_path / "jobs.yaml"))

    assert code == 2 and "TrainJob second: spec.trainer.command: the script trian.py does not exist" in err
    assert backend.list_jobs() == [] and processes_under(trainjob_home) == []
    # the SDK's apply refuses it the same way, before anything is stored
    with pytest.raises(ValidationError, match="the script missing.py does not exist"):
        backend.apply(trainjob_resource("sdk", ["python", "-u", "missing.py"]))
    with pytest.raises(ValidationError, match="the program ./run.sh does not exist"):
        backend.apply(trainjob_resource("sdk", ["./run.sh"]))
    assert backend.list_jobs() == []


SLEEPER = """
import os, sys, time
print("started", os.getpid(), "rank", os.environ["RANK"], flush=True)
time.sleep(600)
"""


def test_logs_rank_and_node_that_match_nothing_say_so(local_jobs, cli, tmp_path, backend):
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello', os.environ['RANK'], flush=True)\n")
    assert cli("run", str(script), "--nodes", "2", "--nproc-per-node", "2", "--name", "grid")[0] == 0

    code, _, err = cli("logs", "grid", "--node", "0", "--rank", "3")
    assert code == 2 and "rank 3 runs on node-1, not node-0" in err and "--node 1" in err
    code, _, err = cli("logs", "grid", "--rank", "4")
    assert code == 2 and "rank: must be 0..3 for TrainJob grid, got 4" in err
    code, out, _ = cli("logs", "grid", "--node", "1", "--rank", "3")
    assert (code, out) == (0, "node-1/rank-3 | hello 3\n")
    code, out, err = cli("logs", "grid", "--since", "2020-01-01T00:00:00Z", "--tail", "1")
    assert code == 0 and len(out.splitlines()) == 1
    code, out, err = cli("logs", "grid", "--since", "1s", "--rank", "2")
    if not out:  # written more than a second ago: nothing matches, and it says so
        assert "no log lines from rank-2 since 1s in trainjob/grid" in err
    code, _, err = cli("logs", "grid", "--previous")
    assert code == 2 and "no previous attempt" in err
    assert cli("logs", "grid", "--since", "yesterday")[0] == 2


def test_suspend_leaves_no_crash_in_the_logs_and_resume_keeps_the_previous_attempt(local_jobs, cli, tmp_path, backend):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    assert cli("run", str(script), "--nodes", "2", "--name", "nap", "-d")[0] == 0
    wait_until(lambda: sum("started" in line.text for line in backend.logs("nap")) == 2, timeout=120)

    assert cli("suspend", "nap")[0] == 0
    shown = cli("logs", "nap")[1]
    assert "[trainjob] node-0 stopping: the job was suspended" in shown
    assert "Traceback" not in shown and "SignalException" not in shown and "death signal" not in shown
    everything = cli("logs", "nap", "--stop-output")[1]
    assert len(everything.splitlines()) > len(shown.splitlines()) - 2  # the shutdown lines are kept, only folded

    first = {line.text.split()[1] for line in backend.logs("nap") if line.text.startswith("started")}
    assert cli("resume", "nap")[0] == 0

    def restarted() -> bool:
        texts = [line.text for line in backend.logs("nap")]
        return any("attempt started" in t for t in texts) and sum(t.startswith("started") for t in texts) == 2

    wait_until(restarted, timeout=120)
    previous = cli("logs", "nap", "--previous")[1]
    current = cli("logs", "nap")[1]
    assert {p for p in first if p in previous} == first and not any(p in current for p in first)
    assert "stopping: the job was suspended" in previous and "attempt started" in current
    assert os.path.isdir(backend.store.job_dir("nap") / "logs" / "previous")
