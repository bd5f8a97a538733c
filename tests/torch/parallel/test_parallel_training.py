"""Real 4-process gloo runs: every layout trains like one process, checkpoints move between layouts.

One launch runs every scenario (process start-up costs more than a scenario) and the tests read its results.

Tolerances: losses and gradient norms within 1e-5 relative, parameters within 1e-5 absolute of the single-process
run after three SGD steps with gradient clipping. Float32 reduction order gives differences around 1e-7; a
gradient scaled wrongly (a missing micro-batch or data-parallel average, a norm missing a stage) moves the
parameters by about 1e-2.
"""

import sys
from pathlib import Path

import pytest
import torch

from trainjob.torch.parallel import SCHEDULES, ParallelDims, PipelineConfig, check_microbatches

sys.path.insert(0, str(Path(__file__).parent))
import dist_workers_parallel as workers  # noqa: E402

STEPS = 3
TP_PP = {"dp_shard": 1, "tp": 2, "pp": 2}
LAYOUTS = {
    **{
        f"tp2_pp2_{schedule}": {"dims": TP_PP, "pipeline": {"schedule": schedule, "microbatches": 4}}
        for schedule in SCHEDULES
    },
    "tp2_dp2": {"dims": {"dp_shard": 2, "tp": 2}},
    # Tensor parallel without FSDP: DTensor and plain gradients side by side, clipped by trainjob.torch.
    "tp4_clipped_by_trainjob_torch": {"dims": {"dp_shard": 1, "tp": 4}, "clip_with": "trainjob.torch"},
    "pp2_dp2": {"dims": {"dp_shard": 2, "pp": 2}, "pipeline": {"schedule": "1F1B", "microbatches": 2}},
    "tp2_dp2_sequence_parallel_checkpointed_zero2": {
        "dims": {"dp_shard": 2, "tp": 2},
        "sequence_parallel": True,
        "activation_checkpointing": True,
        "zero_stage": 2,
    },
    "tp2_pp2_sequence_parallel": {
        "dims": TP_PP,
        "sequence_parallel": True,
        "pipeline": {"schedule": "Interleaved1F1B", "microbatches": 2},
    },
    "tp2_hsdp_replicate2": {"dims": {"dp_replicate": 2, "dp_shard": 1, "tp": 2}},
    "hsdp_2x2": {"dims": {"dp_replicate": 2, "dp_shard": 2}},
    "pp2_ddp2_zero0": {"dims": {"dp_shard": 2, "pp": 2}, "zero_stage": 0, "pipeline": {"schedule": "GPipe"}},
    "tp2_pp2_through_prepare_model": {
        "dims": TP_PP,
        "via": "prepare_model",
        "activation_checkpointing": True,
        "sequence_parallel": True,
        "pipeline": {"schedule": "GPipe", "microbatches": 2},
        "clip_with": "trainjob.torch",  # the norm spans both stages
    },
    "tp2_dp2_cpu_offload": {"dims": {"dp_shard": 2, "tp": 2}, "cpu_offload": True},
    "pp2_dp2_zero_bubble_checkpointed_zero1": {
        "dims": {"dp_shard": 2, "pp": 2},
        "zero_stage": 1,
        "activation_checkpointing": True,
        "pipeline": {"schedule": "ZBVZeroBubble", "microbatches": 2},
    },
}
BF16 = {"dims": {"dp_shard": 2, "pp": 2}, "mixed_precision": "bf16", "pipeline": {"schedule": "1F1B"}}
RESUME = {
    "save": {"dims": TP_PP, "pipeline": {"schedule": "Interleaved1F1B", "microbatches": 4}},
    "load": {"dims": {"dp_shard": 4}},
    "steps": 4,
}
ACCUMULATION = {
    "ddp4": {"dims": {"dp_shard": 4}, "zero_stage": 0},
    "fsdp4": {"dims": {"dp_shard": 4}},
}
MAX_MICROBATCHES = 9
REFUSALS = {
    "ddp_with_tp": (
        {"dims": {"dp_shard": 2, "tp": 2}, "zero_stage": 0},
        "zero_stage: DDP (zero_stage=0) cannot wrap tensor-parallel layers (tp=2)",
    ),
    "zero_stage_4": (
        {"dims": {"dp_shard": 4}, "zero_stage": 4},
        "zero_stage: must be 0 (DDP), 1, 2 or 3 (FSDP), got 4",
    ),
    "heads_not_divisible": (
        {"dims": {"dp_shard": 1, "tp": 4}, "model": {"n_heads": 2}},
        "parallel.tp: 4 does not divide layers.0.attn.n_heads=2 (the attention head count); tp must be one of [1, 2]",
    ),
    "too_few_microbatches": (
        {"dims": {"dp_shard": 2, "pp": 2}, "pipeline": {"schedule": "1F1B", "microbatches": 1}},
        "pipeline.microbatches: 1F1B needs at least as many micro-batches as stages (2), got 1",
    ),
    "batch_not_divisible": (
        {"dims": {"dp_shard": 2, "pp": 2}, "pipeline": {"schedule": "GPipe", "microbatches": 3}},
        "batch: batch size 8 is not divisible by 3 micro-batches",
    ),
    "world_size_mismatch": (
        {"dims": {"tp": 2, "world_size": 8}},
        "parallel.world_size: is 8 but the process group has 4 ranks",
    ),
    "bf16_with_ddp": (
        {"dims": {"dp_shard": 4}, "zero_stage": 0, "mixed_precision": "bf16"},
        "mixed_precision and cpu_offload need FSDP: use zero_stage 1, 2 or 3",
    ),
}


@pytest.fixture(scope="module")
def results(distributed, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    scenarios = [
        {"name": name, "kind": "train", "layout": layout, "steps": STEPS}
        for name, layout in {**LAYOUTS, "bf16": BF16}.items()
    ]
    scenarios += [
        {"name": "resume", "kind": "resume", **RESUME},
        {"name": "mesh", "kind": "mesh", "dims": TP_PP},
        {"name": "accumulation", "kind": "accumulation", "layouts": ACCUMULATION},
        {"name": "schedule_rules", "kind": "schedule_rules", "max_microbatches": MAX_MICROBATCHES},
        {
            "name": "refusals",
            "kind": "refusals",
            "layouts": {name: layout for name, (layout, _) in REFUSALS.items()},
        },
    ]
    tmp_dir = str(tmp_path_factory.mktemp("parallel"))
    return distributed(
        "dist_workers_parallel:run_scenarios",
        nproc=4,
        kwargs={"scenarios": scenarios, "tmp_dir": tmp_dir},
        timeout=240,
    )


@pytest.fixture(scope="module")
def reference() -> dict:
    return workers.reference_run(STEPS)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_trains_like_one_process(results, reference, layout):
    for rank, result in enumerate(results):
        assert result[layout]["losses"] == pytest.approx(reference["losses"], rel=1e-5), f"rank {rank}"
        assert result[layout]["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-5), (
            f"rank {rank}"
        )
        assert result[layout]["held_out_loss"] == pytest.approx(reference["held_out_loss"], rel=1e-5)
    gathered = {}
    for result in results:  # with pipeline parallelism each rank holds its stages' parameters
        gathered.update(result[layout]["params"])
    assert sorted(gathered) == sorted(reference["params"])
    for name, expected in reference["params"].items():
        torch.testing.assert_close(gathered[name], expected, rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_activation_checkpointing_wraps_every_block_this_rank_holds_and_nothing_else(results, layout):
    for rank, result in enumerate(results):
        held = sorted(
            {".".join(name.split(".")[:2]) for name in result[layout]["params"] if name.startswith("layers.")}
        )
        expected = held if LAYOUTS[layout].get("activation_checkpointing") else []
        assert result[layout]["checkpointed"] == expected, f"rank {rank}"


def test_prepare_model_hands_the_parallel_options_to_parallelize(results):
    layout = LAYOUTS["tp2_pp2_through_prepare_model"]
    for rank, result in enumerate(results):
        built = result["tp2_pp2_through_prepare_model"]
        assert built["pipeline"] == PipelineConfig(**layout["pipeline"]), f"rank {rank}"
        assert built["sequence_sharded_norms"], f"rank {rank}: sequence_parallel did not arrive"
    assert not results[0]["tp2_pp2_GPipe"]["sequence_sharded_norms"]  # the check can tell the difference


def test_bf16_pipeline_passes_bf16_activations_between_stages_and_stays_close(results, reference):
    # bf16 keeps 8 bits of mantissa: the losses agree to about 1e-3, not 1e-7, which shows bf16 compute ran.
    for result in results:
        assert result["bf16"]["losses"] == pytest.approx(reference["losses"], abs=2e-3)
        assert result["bf16"]["losses"] != pytest.approx(reference["losses"], abs=1e-6)
        assert all(param.dtype == torch.float32 for param in result["bf16"]["params"].values())


def test_checkpoint_saved_at_tp2_pp2_continues_at_dp4_with_the_same_losses(results):
    for result in results:
        run = result["resume"]
        assert run["step"] == RESUME["steps"] // 2
        assert run["resumed"] == pytest.approx(run["uninterrupted"], rel=1e-5)
        # The optimizer state matters: without it the second step after loading already differs.
        assert abs(run["without_optimizer_state"][1] - run["uninterrupted"][1]) > 1e-4
    assert results[0]["resume"]["before_save"] == pytest.approx(
        workers.reference_run(RESUME["steps"], optimizer="adamw")["losses"][: RESUME["steps"] // 2], rel=1e-5
    )


@pytest.mark.parametrize("layout", list(ACCUMULATION))
def test_gradient_accumulation_reduces_a_parallel_model_only_on_the_last_micro_step(results, layout):
    for rank, result in enumerate(results):
        assert result["accumulation"][layout] == {"first_unreduced": True, "last_reduced": True}, (
            f"rank {rank}"
        )


def test_device_mesh_groups_are_the_printed_layout(results):
    dims = ParallelDims(**TP_PP, world_size=4)
    for rank, result in enumerate(results):
        for dim in ("tp", "pp", "dp"):
            expected = next(group for group in dims.groups(dim) if rank in group)
            assert result["mesh"][dim] == expected, (rank, dim)


def test_microbatch_rules_agree_with_what_pytorchs_schedules_accept(results):
    accepted_by_pytorch = results[0]["schedule_rules"]
    for schedule in SCHEDULES:
        stages = 2 * PipelineConfig(schedule=schedule).resolved_stages_per_rank()
        ours = []
        for microbatches in range(1, MAX_MICROBATCHES + 1):
            try:
                check_microbatches(schedule, microbatches, pp=2, num_stages=stages)
            except ValueError:
                continue
            ours.append(microbatches)
        assert ours == accepted_by_pytorch[schedule], schedule


@pytest.mark.parametrize("case", list(REFUSALS))
def test_settings_that_cannot_work_are_refused_with_the_setting_to_change(results, case):
    assert REFUSALS[case][1] in results[0]["refusals"][case]
