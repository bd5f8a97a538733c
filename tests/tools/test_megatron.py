"""Megatron-LM launches: ``trainjob check`` on a TrainJob or PyTorchJob running ``pretrain_gpt.py`` (TJ018),
``trainjob plan --megatron-args`` and the flag names ``examples/gpt_3d.py`` shares with them."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from trainjob.cli import tools
from trainjob.errors import ValidationError
from trainjob.tools.megatron import find_megatron_launch, layout_problems, parse_megatron_args
from trainjob.tools.sizing.memory import estimate_memory
from trainjob.tools.training_setup import TrainingSetup

# Seed 003's Megatron-LM command (the flags the layout needs, and some it passes over).
SEED_ARGS = [
    "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "4", "--num-layers", "96",
    "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length", "2048",
    "--max-position-embeddings", "2048", "--micro-batch-size", "4", "--global-batch-size", "512",
    "--train-iters", "500000", "--lr", "1.5e-4", "--fp16", "--data-path", "/data/my-dataset",
]  # fmt: skip
SEED_LINE = "python pretrain_gpt.py " + " ".join(SEED_ARGS)
SHM = {
    "targetJobs": [{"name": "node"}],
    "spec": {
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
        "containers": [{"name": "node", "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}],
    },
}


def trainjob(args: list[str], *, nodes: int = 64, gpus: int = 8, command: list[str] | None = None,
             env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A TrainJob on ``nodes`` × ``gpus`` (numProcPerNode auto), with /dev/shm so only TJ018 can fire."""
    trainer: dict[str, Any] = {
        "numNodes": nodes, "numProcPerNode": "auto", "resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus}},
        "command": command or ["torchrun", "pretrain_gpt.py"], "args": args,
    }  # fmt: skip
    if env:
        trainer["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "gpt"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer, "podTemplateOverrides": [SHM]},
    }  # fmt: skip


def replaced(flag: str, value: str) -> list[str]:
    args = list(SEED_ARGS)
    args[args.index(flag) + 1] = value
    return args


@pytest.fixture
def run() -> Any:
    group = click.Group("trainjob")
    tools.register(group)
    runner = CliRunner()
    return lambda *args: runner.invoke(group, list(args))


def check(run: Any, tmp_path: Path, *documents: dict[str, Any]) -> Any:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return run("check", str(path))


# -- trainjob check ------------------------------------------------------------------------------------------------


def test_the_seed_command_on_512_gpus_passes(run, tmp_path) -> None:
    result = check(run, tmp_path, trainjob(SEED_ARGS))
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "1 manifest checked: 0 errors, 0 warnings, 0 hints"


@pytest.mark.parametrize(
    ("args", "nodes", "flag", "message", "fix"),
    [
        (replaced("--tensor-model-parallel-size", "16"), 64, "--tensor-model-parallel-size",
         "--tensor-model-parallel-size 16: a tensor-parallel group crosses nodes, which run 8 processes",
         "use --tensor-model-parallel-size 8"),
        (replaced("--pipeline-model-parallel-size", "3"), 64, "--pipeline-model-parallel-size",
         "tp × pp = 8 × 3 = 24 does not divide the world size (512 ranks = 64 nodes × 8 processes)",
         "use --pipeline-model-parallel-size 4"),
        (replaced("--num-layers", "90"), 64, "--num-layers",
         "--num-layers 90 does not divide by --pipeline-model-parallel-size 4",
         "use --pipeline-model-parallel-size 2, or --num-layers 88"),
        (replaced("--num-attention-heads", "12"), 64, "--num-attention-heads",
         "--num-attention-heads 12 does not divide by --tensor-model-parallel-size 8",
         "use --tensor-model-parallel-size 4, or --num-attention-heads 16"),
        (replaced("--global-batch-size", "500"), 64, "--global-batch-size",
         "--global-batch-size 500 is not a multiple of --micro-batch-size 4 × data-parallel size 16",
         "use --global-batch-size 512"),
        # The same command on 60 nodes: dp 15, so 512 no longer splits into micro-batches of 4.
        (SEED_ARGS, 60, "--global-batch-size", "data-parallel size 15 (= 480 / (tp 8 × pp 4)) = 60",
         "use --global-batch-size 540"),
        (replaced("--num-layers", "ninety-six"), 64, "--num-layers",
         "--num-layers: must be a whole number >= 1, got 'ninety-six'", "give --num-layers a whole number >= 1"),
    ],
)  # fmt: skip
def test_a_broken_layout_is_an_error_naming_the_flag_and_a_value_that_works(
    run, tmp_path, args, nodes, flag, message, fix
) -> None:
    result = check(run, tmp_path, trainjob(args, nodes=nodes))
    assert result.exit_code == 1, result.output
    (finding,) = [line for line in result.output.splitlines() if "TJ018" in line]
    assert "error TJ018 megatron-layout: TrainJob gpt: pretrain_gpt.py: " in finding and message in finding
    assert f"fix: {fix}" in result.output
    line = int(finding.split(":")[1])  # the finding points at the flag's line in the file
    assert flag in (tmp_path / "job.yaml").read_text().splitlines()[line - 1]


def test_tp_must_stay_within_the_gpus_of_a_node(run, tmp_path) -> None:
    small = ["--tensor-model-parallel-size", "8", "--num-attention-heads", "32"]
    assert check(run, tmp_path, trainjob(small, nodes=2, gpus=8)).exit_code == 0
    result = check(run, tmp_path, trainjob(small, nodes=4, gpus=4))  # numProcPerNode auto = 4 GPUs
    assert result.exit_code == 1
    assert "crosses nodes, which run 4 processes each" in result.output
    assert "use --tensor-model-parallel-size 4 (it divides 4)" in result.output


def test_a_shell_command_and_env_values_are_read_as_the_shell_reads_them(run, tmp_path) -> None:
    script = (
        "cd /workspace && torchrun --nproc-per-node 8 pretrain_gpt.py \\\n"
        "  --tensor-model-parallel-size $(TP) --pipeline-model-parallel-size ${PP} \\\n"
        "  --num-layers 96 --num-attention-heads 96  # GPT-3 175B\n"
        "echo done --pipeline-model-parallel-size 5\n"
    )
    job = trainjob([script], command=["bash", "-c"], env={"TP": "8", "PP": "4"})
    assert check(run, tmp_path, job).exit_code == 0
    job = trainjob([script], command=["bash", "-c"], env={"TP": "8", "PP": "5"})
    assert "--pipeline-model-parallel-size 5: tp × pp = 8 × 5" in check(run, tmp_path, job).output
    # A value filled in only at run time is not checked.
    job = trainjob([script.replace("$(TP)", "$RUNTIME_TP")], command=["bash", "-c"], env={"PP": "5"})
    assert check(run, tmp_path, job).exit_code == 0


def test_a_backslash_followed_by_spaces_ends_the_command(run, tmp_path) -> None:
    script = "python pretrain_gpt.py \\\n  --tensor-model-parallel-size 8 \\    # TP\n  --num-layers 96 \\\n  --fp16\n"
    result = check(run, tmp_path, trainjob([script], command=["bash", "-c"]))
    assert result.exit_code == 1
    assert "ends in a backslash followed by spaces, so the shell ends the command there" in result.output
    launch = find_megatron_launch(["bash", "-c", script])
    assert launch is not None and launch.args == ["--tensor-model-parallel-size", "8", " "]


def test_a_pytorchjob_is_checked_against_its_replicas_and_nproc_per_node(run, tmp_path) -> None:
    line = f"torchrun --nproc_per_node=8 --nnodes=$(WORLD_SIZE) {SEED_LINE.removeprefix('python ')}"
    container = {"name": "pytorch", "image": "megatron", "command": ["bash", "-c"], "args": [line],
                 "resources": {"limits": {"nvidia.com/gpu": 8}},
                 "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}  # fmt: skip
    template = {"spec": {"containers": [container], "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}}
    job = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "gpt"},
        "spec": {"nprocPerNode": "8", "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": template},
            "Worker": {"replicas": 63, "template": copy.deepcopy(template)},
        }},
    }  # fmt: skip
    assert check(run, tmp_path, job).exit_code == 0, check(run, tmp_path, job).output
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 62  # 504 ranks: 32 does not divide it
    result = check(run, tmp_path, job)
    assert result.exit_code == 1 and "does not divide the world size (504 ranks = 63 nodes × 8 processes)" in (
        result.output
    )


def test_jobs_without_megatron_are_left_alone(run, tmp_path) -> None:
    job = trainjob(["--tensor-model-parallel-size", "3"], command=["torchrun", "train.py"])
    assert check(run, tmp_path, job).exit_code == 0


# -- reading the flags ---------------------------------------------------------------------------------------------


def test_flags_are_read_with_megatron_defaults() -> None:
    args = parse_megatron_args(["--num-layers=24", "--bf16", "--use-distributed-optimizer", "--sequence-parallel",
                                "--recompute-activations", "--optimizer", "sgd"])  # fmt: skip
    assert (args.tp, args.pp, args.layers, args.dtype, args.optimizer) == (1, 1, 24, "bf16", "sgd")
    assert args.distributed_optimizer and args.sequence_parallel and args.recompute == "selective"
    assert parse_megatron_args([]).dtype == "fp32"
    assert parse_megatron_args(["--recompute-granularity", "full"]).recompute == "full"


@pytest.mark.parametrize(
    ("tokens", "error"),
    [
        (["--tensor-model-parallel-size", "0"], "--tensor-model-parallel-size: must be a whole number >= 1, got '0'"),
        (["--micro-batch-size", "--fp16"], "--micro-batch-size: needs a value: a whole number >= 1"),
        (["--recompute-granularity", "some"], "--recompute-granularity: must be full or selective, got 'some'"),
        (["--fp16", "--bf16"], "--bf16: and --fp16 are both given; Megatron-LM takes one of them"),
    ],
)
def test_a_value_megatron_refuses_names_the_flag_and_what_it_accepts(tokens, error) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_megatron_args(tokens)
    assert str(caught.value) == error


# -- trainjob plan --megatron-args ---------------------------------------------------------------------------------


def test_plan_reads_the_seed_config_and_says_it_does_not_fit_in_80_gib(run) -> None:
    result = run("plan", "--megatron-args", SEED_LINE, "--gpus", "8", "--nodes", "64", "--gpu-memory", "80Gi")
    assert result.exit_code == 0, result.output
    assert "Megatron-LM: tp 8 × pp 4 × dp 16 on 512 GPUs, 8 micro-batches of 4 per step, fp16" in result.output
    assert "assumptions:" in result.output and "Korthikanti" in result.output
    assert "does not fit: 288.0 GiB per GPU (81.0 GiB model states + 207.0 GiB activations) over 80 GiB" in (
        result.output
    )


def test_plan_json_counts_the_zero_paper_states_and_megatron_activations(run) -> None:
    extra = " --use-distributed-optimizer --sequence-parallel --recompute-activations"
    result = run("plan", "--megatron-args", SEED_LINE + extra, "--gpus", "8", "--nodes", "64", "--gpu-memory",
                 "80Gi", "-o", "json")  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    psi = 12 * 96 * 12288**2 / (8 * 4)
    s, b, h, t = 2048, 4, 12288, 8
    assert data["memory"]["model_states"] == pytest.approx(2 * psi + 2 * psi + 12 * psi / 16)  # ZeRO-1 over dp 16
    assert data["memory"]["activations"] == pytest.approx(96 * s * b * h * 34 / t)  # 4 in flight × 24 layers
    assert data["memory"]["fits"] is True
    assert data["megatron"]["args"]["recompute"] == "selective"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--megatron-args", "--num-layers x"], "--megatron-args: --num-layers: must be a whole number >= 1"),
        (["--megatron-args", "--num-layers 96"], "--megatron-args: --hidden-size: is needed for the memory estimate"),
        (["--megatron-args", SEED_LINE, "--tp", "2"], "--tp: comes from --megatron-args"),
        (["--megatron-args", SEED_LINE.replace("pipeline-model-parallel-size 4", "pipeline-model-parallel-size 3")],
         "--megatron-args: --pipeline-model-parallel-size 3: tp × pp = 8 × 3 = 24 does not divide the world size"),
    ],
)  # fmt: skip
def test_plan_refuses_bad_megatron_args_naming_the_flag(run, argv, error) -> None:
    result = run("plan", *argv, "--gpus", "8", "--nodes", "64")
    assert result.exit_code == 2
    assert error in result.output


def test_sequence_parallel_splits_all_activations_over_tp() -> None:
    shape = dict(layers=96, hidden=12288, heads=96, seq=2048, micro_batch=4, global_batch=512, tp=8, pp=4,
                 gpus=8, nodes=64, dtype="fp16")  # fmt: skip
    s, b, h, a, t = 2048, 4, 12288, 96, 8
    plain = estimate_memory(TrainingSetup(**shape))
    parallel = estimate_memory(TrainingSetup(**shape, sequence_parallel=True))
    assert plain.activations == pytest.approx(96 * s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert parallel.activations == pytest.approx(96 * s * b * h * (34 / t + 5 * a * s / (h * t)))
    assert parallel.activations_checkpointed == pytest.approx(96 * 2 * s * b * h / t + s * b * h * (34 / t + 5 * a * s / (h * t)))
    with pytest.raises(ValidationError, match="seq: must be divisible by tp"):
        TrainingSetup(**{**shape, "seq": 2044}, sequence_parallel=True)


# -- examples/gpt_3d.py --------------------------------------------------------------------------------------------


def load_example() -> Any:
    """``examples/gpt_3d.py`` as a module; loaded when the tests are collected, as importing torch may start a
    process (ldconfig) that a test of this tier may not."""
    path = Path(__file__).resolve().parents[2] / "examples" / "gpt_3d.py"
    spec = importlib.util.spec_from_file_location("gpt_3d_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GPT_3D = load_example()


@pytest.fixture
def gpt_3d() -> Any:
    return GPT_3D


def test_the_example_reads_megatron_flags_as_the_check_does(gpt_3d) -> None:
    argv = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--num-layers", "4",
            "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "2",
            "--global-batch-size", "16", "--bf16"]  # fmt: skip
    example, megatron = gpt_3d.parse_args(argv), parse_megatron_args(argv)
    assert (example.tp, example.pp, example.layers, example.dim, example.heads, example.seq_len) == (
        megatron.tp, megatron.pp, megatron.layers, megatron.hidden, megatron.heads, megatron.seq)
    assert (example.micro_batch_size, example.batch_size, example.mixed_precision) == (
        megatron.micro_batch, megatron.global_batch, megatron.dtype)
    assert gpt_3d.check_layout(example, world_size=8, procs_per_node=8) == 4  # 16 / (2 × dp 2) micro-batches
    assert gpt_3d.parse_args(["--tp", "2", "--batch-size", "8"]).batch_size == 8  # the short names still work


@pytest.mark.parametrize(
    "argv",
    [
        ["--global-batch-size", "10", "--micro-batch-size", "2", "--pipeline-model-parallel-size", "2"],
        ["--tensor-model-parallel-size", "8", "--num-attention-heads", "8"],
        ["--num-layers", "5", "--pipeline-model-parallel-size", "2"],
    ],
)
def test_the_example_refuses_what_the_check_refuses_with_the_same_words(gpt_3d, argv) -> None:
    args = gpt_3d.parse_args(argv)
    (problem,) = layout_problems(parse_megatron_args([*argv, "--num-layers", str(args.layers),
                                                      "--num-attention-heads", str(args.heads)]), 8, 4)  # fmt: skip
    with pytest.raises(SystemExit) as caught:
        gpt_3d.check_layout(args, world_size=8, procs_per_node=4)
    assert str(caught.value) == f"{problem.message}\n  fix: {problem.fix}"
