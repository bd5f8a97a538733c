"""The README's quick start, taken from the README itself: every path it names exists, every command parses, every
job it reads was created by an earlier line, and the block runs as written from the repository's root."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from trainjob.cli.main import cli

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
READING = {"get", "logs", "wait", "describe", "delete", "events", "suspend", "resume"}


def quickstart_commands() -> list[str]:
    """The lines of the first ```bash block under ``## Quick start``, comments removed."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Quick start") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the quick start has no ```bash block"
    return [shlex.join(shlex.split(line, comments=True)) for line in block.group(1).splitlines() if line.strip()]


def parse(argv: list[str]) -> click.Context:
    """Parse ``argv`` (after ``trainjob``) down to the command that would run, without running it."""
    context = cli.make_context("trainjob", list(argv), resilient_parsing=False)
    command, args = context.command, context.protected_args + context.args
    while isinstance(command, click.Group) and args:
        name, sub, rest = command.resolve_command(context, args)
        context = sub.make_context(name, rest, parent=context)
        command, args = sub, context.protected_args + context.args
    return context


def test_the_quick_start_is_there_and_uses_trainjob() -> None:
    commands = quickstart_commands()
    assert len(commands) >= 5
    assert all(shlex.split(c)[0] == "trainjob" for c in commands), commands


@pytest.mark.parametrize("command", quickstart_commands())
def test_every_quick_start_command_parses(command: str) -> None:
    context = parse(shlex.split(command)[1:])
    assert context.command.name not in (None, "trainjob"), command


def test_every_path_the_quick_start_names_exists() -> None:
    for command in quickstart_commands():
        for word in shlex.split(command)[1:]:
            if "/" in word or word.endswith((".py", ".yaml", ".yml")):
                assert (REPO / word).exists(), f"{command!r} names {word}, which is not in the repository"


def test_every_job_the_quick_start_reads_is_created_before() -> None:
    created: set[str] = set()
    for command in quickstart_commands():
        words = shlex.split(command)[1:]
        verb = words[0]
        if verb == "run":
            assert "--name" in words, f"{command!r}: later lines need a name they can know"
            created.add(words[words.index("--name") + 1])
        elif verb == "apply":
            for document in yaml.safe_load_all((REPO / words[words.index("-f") + 1]).read_text()):
                created.add(document["metadata"]["name"])
        elif verb in READING:
            options_with_values = {"-o", "--for", "--timeout", "--node", "--rank", "--tail", "--since"}
            names = [w for i, w in enumerate(words[1:], 1) if not w.startswith("-")
                     and words[i - 1] not in options_with_values]
            assert names and set(names) <= created, f"{command!r} reads {names}; created so far: {sorted(created)}"


def _check_the_first_job(out: str, home: str) -> None:
    """The digits example on 2 nodes x 2 processes: 4 ranks, at least 95 % test accuracy, its progress to the last
    step and its checkpoint in the job's folder."""
    from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig

    assert "node-0/rank-0 | training on 4 processes" in out, out[-6000:]
    assert float(out.split("final test accuracy ")[1].split()[0]) >= 0.95, out[-6000:]
    backend = LocalBackend(LocalProcessBackendConfig(home=Path(home)))
    job = backend.get_job("digits")
    assert job.status == "Complete" and job.progress.step == job.progress.total_steps, job
    assert job.progress.metrics["loss"] < 0.5, job.progress
    assert (backend.store.job_dir("digits") / "checkpoints" / "checkpoint.pt").is_file()


@pytest.mark.timeout(900)
def test_the_quick_start_runs_as_written(subprocesses, tmp_path: Path) -> None:
    env = {**os.environ, "TRAINJOB_HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("TRAINJOB_BACKEND", None)
    transcript, outputs = [], []
    try:
        for command in quickstart_commands():
            result = subprocess.run(command, shell=True, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
            outputs.append(result.stdout + result.stderr)  # whole: a rank's last warnings may be long
            transcript.append(f"$ {command}\n{result.stdout[-1500:]}{result.stderr[-1500:]}")
            assert result.returncode == 0, "\n".join(transcript)
            if len(outputs) == 1:  # the README's first job, before later lines delete it
                _check_the_first_job(outputs[0], env["TRAINJOB_HOME"])
        assert "digits-yaml" in outputs[3] and "digits-bg" in outputs[3], outputs[3]
        assert outputs[5].count("node-0/rank-0 | ") >= 5 and "final test accuracy" in outputs[5], outputs[5][-6000:]
    finally:
        subprocess.run("trainjob delete --all", shell=True, cwd=REPO, env=env, capture_output=True, timeout=120)
