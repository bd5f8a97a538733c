"""``trainjob plan --ds-config``: a DeepSpeed config's memory per GPU, the keys it used, and its errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from trainjob.cli import tools
from trainjob.tools.sizing.deepspeed import deepspeed_setup
from trainjob.tools.sizing.memory import estimate_memory
from trainjob.tools.training_setup import TrainingSetup

SEED_CONFIG = Path(__file__).parents[1] / "torch" / "deepspeed_configs" / "seed003_ds_config.json"


@pytest.fixture
def run() -> Any:
    group = click.Group("trainjob")
    tools.register(group)
    runner = CliRunner()
    return lambda *args: runner.invoke(group, [str(a) for a in args])


@pytest.fixture
def write(tmp_path: Path) -> Any:
    def write_config(config: dict[str, Any]) -> Path:
        path = tmp_path / "ds_config.json"
        path.write_text(json.dumps(config))
        return path

    return write_config


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"train_batch_size": 64, "zero_optimization": {"stage": 0}},
         {"zero": 0, "dtype": "fp32", "optimizer": "adam", "micro_batch": 8, "micro_batches": 1}),
        ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}},
         {"zero": 2, "dtype": "bf16", "optimizer": "adamw", "offload": True, "cpu_offload": False,
          "micro_batch": 2, "micro_batches": 4}),
        ({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "optimizer": {"type": "SGD", "params": {}},
          "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}},
         {"zero": 3, "dtype": "fp16", "optimizer": "sgd", "offload": False, "cpu_offload": True}),
    ],
)
def test_config_keys_become_the_planners_setup(config, expected, write):
    setup, _, _ = deepspeed_setup(write(config), params=1e9, layers=16, hidden=2048, gpus=8)
    assert {key: getattr(setup, key) for key in expected} == expected


def test_seed_config_on_the_command_line_prints_keys_used_and_memory(run):
    args = ["plan", "--ds-config", SEED_CONFIG, "--params", "70B", "--layers", "80", "--hidden", "8192",
            "--heads", "64", "--seq", "4096", "--gpus", "8", "--activation-checkpointing", "--gpu-memory", "80GB"]  # fmt: skip
    table = run(*args)
    assert table.exit_code == 0, table.output
    assert f"{SEED_CONFIG}, keys used:" in table.output
    for line in ("zero_optimization.stage = 3", 'zero_optimization.offload_param.device = "cpu"',
                 "fp16.enabled = true", "train_micro_batch_size_per_gpu = 4", "gradient_accumulation_steps = 8"):  # fmt: skip
        assert line in table.output
    assert "ZeRO-3, fp16, adamw" in table.output
    data = json.loads(run(*args, "-o", "json").output)
    assert data["ds_config"]["used"]["zero_optimization.stage"] == 3
    assert "zero_optimization.stage3_max_live_parameters" in data["ds_config"]["ignored"]
    assert data["setup"]["cpu_offload"] is True and data["setup"]["micro_batches"] == 8
    expected = estimate_memory(TrainingSetup(params=70e9, layers=80, hidden=8192, heads=64, seq=4096, gpus=8, zero=3,
                                         dtype="fp16", optimizer="adamw", cpu_offload=True, micro_batch=4,
                                         micro_batches=8, activation_checkpointing=True))  # fmt: skip
    assert data["memory"]["total"] == expected.total
    assert data["memory"]["offloaded_to_host"] == 70e9 * 16 / 8  # fp32 parameters + gradients + Adam moments


@pytest.mark.parametrize(
    ("stage", "parameters", "gradients", "optimizer"),
    [(0, 2, 2, 12), (1, 2, 2, 12 / 4), (2, 2, 2 / 4, 12 / 4), (3, 2 / 4, 2 / 4, 12 / 4)],
)
def test_each_zero_stage_shards_what_deepspeed_shards(run, write, stage, parameters, gradients, optimizer):
    path = write({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage}})
    data = json.loads(run("plan", "--ds-config", path, "--params", "1e9", "--gpus", "4", "-o", "json").output)
    memory = data["memory"]
    assert (memory["parameters"], memory["gradients"], memory["optimizer_states"]) == pytest.approx(
        (parameters * 1e9, gradients * 1e9, optimizer * 1e9)
    )


def test_flags_the_config_sets_are_refused(run):
    result = run("plan", "--ds-config", SEED_CONFIG, "--params", "7B", "--gpus", "8", "--dtype", "bf16")
    assert result.exit_code == 2
    assert f"error: --dtype: comes from --ds-config {SEED_CONFIG}; leave it out" in result.output
    result = run("plan", "--ds-config", SEED_CONFIG, "--auto", "--params", "7B", "--gpus", "8")
    assert result.exit_code == 2
    assert "error: --auto: searches the layouts itself" in result.output


@pytest.mark.parametrize(
    ("config", "gpus", "message"),
    [
        ("{\n  \"zero_optimization\": {\"stage\": 3\n}", 8, "is not valid JSON: line 3, column 2"),
        ({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8}, 4,
         "train_batch_size: must equal train_micro_batch_size_per_gpu × gradient_accumulation_steps × world size "
         "(4 × 8 × 4 = 128), got 256"),
        ({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}, 8,
         "zero_optimization.offload_param: needs --layers and --hidden"),
        ({"train_batch_size": 8, "optimizer": {"type": "Lamb"}}, 8,
         "optimizer.type: the planner knows Adam, AdamW and SGD optimizer states, got 'Lamb'"),
    ],
)
def test_config_errors_name_the_file_and_key(run, tmp_path, config, gpus, message):
    path = tmp_path / "ds_config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    result = run("plan", "--ds-config", path, "--params", "7B", "--gpus", gpus)
    assert result.exit_code == 2
    assert f"error: {path}: {message}" in result.output


def test_missing_file_and_unknown_keys(run, tmp_path, write):
    result = run("plan", "--ds-config", tmp_path / "nope.json", "--params", "7B")
    assert result.exit_code == 2
    assert f"error: deepspeed_config: no such file: {tmp_path / 'nope.json'}" in result.output
    path = write({"train_batch_size": 8, "zero_optimisation": {"stage": 3}})
    result = run("plan", "--ds-config", path, "--params", "7B", "--gpus", "8")
    assert result.exit_code == 0
    assert f"warning: {path}: ignoring keys trainjob does not know: zero_optimisation" in result.output
    assert "ZeRO-0" in result.output
