"""``trainjob plan`` and ``trainjob check`` from the command line: output, exit codes, errors naming flags."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from trainjob.cli import tools


@pytest.fixture
def run() -> object:
    group = click.Group("trainjob")
    tools.register(group)
    runner = CliRunner()

    def invoke(*args: str):  # noqa: ANN202
        return runner.invoke(group, list(args))

    return invoke


def test_plan_prints_memory_and_communication_tables(run) -> None:  # noqa: ANN001
    result = run("plan", "--params", "7.5B", "--gpus", "8", "--nodes", "8", "--zero", "1", "--dtype", "fp16")
    assert result.exit_code == 0, result.output
    assert "31.41 GB" in result.output  # model states, ZeRO paper
    assert "grad reduce-scatter" in result.output


def test_plan_json_has_bytes_and_the_fit_verdict(run) -> None:  # noqa: ANN001
    result = run(
        "plan", "--params", "7e9", "--gpus", "8", "--zero", "0", "--gpu-memory", "80Gi", "-o", "json"
    )
    data = json.loads(result.output)
    assert data["memory"]["model_states"] == 16 * 7e9
    assert data["memory"]["fits"] is False
    assert data["communication"]["collectives"][0]["name"] == "grad all-reduce"


def test_plan_bandwidth_flag_changes_the_time(run) -> None:  # noqa: ANN001
    def seconds(*extra: str) -> float:
        result = run("plan", "--params", "1e9", "--gpus", "8", "-o", "json", *extra)
        return json.loads(result.output)["communication"]["seconds_per_step"]

    assert seconds("--bandwidth", "intra=150GB/s") > seconds("--bandwidth", "intra=300GB/s")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--params", "7e9", "--zero", "5"], "error: --zero: must be one of 0, 1, 2, 3, got 5"),
        (["--params", "7e9", "--gpus", "8", "--tp", "3"], "error: --tp: tp × pp (3) must divide"),
        (["--params", "lots"], "error: --params: must be a number with an optional K, M, B or T suffix"),
        (["--params", "7e9", "--gpu-memory", "80 bananas"], "error: --gpu-memory: must be a byte size"),
        (["--params", "7e9", "--bandwidth", "nvlink=1"], "error: --bandwidth: must look like intra=300GB/s"),
        (
            ["--params", "7e9", "--global-batch", "7", "--micro-batches", "2"],
            "error: --global-batch: give either",
        ),
    ],
)
def test_plan_bad_flags_exit_2_naming_the_flag(run, args: list[str], message: str) -> None:  # noqa: ANN001
    result = run("plan", *args)
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.parametrize(
    ("script", "exit_code", "summary"),
    [
        ("import torch\nprint(torch.ones(2))\n", 0, "0 errors, 0 warnings, 0 hints"),
        ("loader = DataLoader(d, sampler=DistributedSampler(d))\n", 1, "1 error, 1 warning, 0 hints"),
    ],
)
def test_check_exit_code_follows_errors(
    run, tmp_path: Path, script: str, exit_code: int, summary: str
) -> None:  # noqa: ANN001
    path = tmp_path / "train.py"
    path.write_text(script)
    result = run("check", str(path))
    assert result.exit_code == exit_code
    assert summary in result.output


def test_check_json_lists_findings_with_locations(run, tmp_path: Path) -> None:  # noqa: ANN001
    path = tmp_path / "train.py"
    path.write_text("import torch.distributed as dist\ndist.init_process_group(backend='nccl')\n")
    result = run("check", str(path), "-o", "json")
    found = {(f["rule"], f["line"]) for f in json.loads(result.output)}
    assert found == {("TJ006", 2), ("TJ007", 2), ("TJ010", 1)}


@pytest.mark.parametrize(
    ("files", "extra", "message"),
    [
        ({"train.py": "for x in :\n"}, [], "/train.py: line 1: cannot parse the script"),
        ({}, [], "/missing.py: cannot read the script"),
        ({"train.py": "x = 1\n"}, ["--ignore", "TJ999"], "--ignore: unknown rule 'TJ999'"),
    ],
)
def test_check_bad_input_exits_2(run, tmp_path: Path, files: dict, extra: list[str], message: str) -> None:  # noqa: ANN001
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    target = tmp_path / (next(iter(files)) if files else "missing.py")
    result = run("check", str(target), *extra)
    assert result.exit_code == 2
    assert message in result.output
    assert "--/" not in result.output


def test_bench_rejects_a_bad_size_before_starting_processes(run) -> None:  # noqa: ANN001
    result = run("bench", "collectives", "--max-bytes", "16Q")
    assert result.exit_code == 2
    assert "error: --max-bytes: must be a byte size" in result.output
