"""A ds_config trains on 2 real processes (gloo) exactly as the plain trainjob calls it maps to.

Each scenario runs twice in the same processes: once through ``deepspeed_initialize`` with DeepSpeed's loop
(``engine(x)``, ``engine.backward(loss)``, ``engine.step()``) and once written with ``prepare_model`` /
``apply_fsdp``, ``GradientAccumulation``, ``clip_grad_norm_`` and AdamW. Tolerance: 1e-6 relative on every step's
global loss; both runs do the same operations in the same order, so they agree to rounding. The loss must also fall
by a quarter over the run (last 3 steps against the first 3), so a run that did not train cannot pass by matching another that did not.
"""

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

SEED_CONFIG = Path(__file__).parent / "deepspeed_configs" / "seed003_ds_config.json"
STEPS = 12


def seed_config(**changes: Any) -> dict[str, Any]:
    """Seed 003's ds_config with the batch sizes of a small run on 2 processes and a learning rate that moves."""
    config = json.loads(SEED_CONFIG.read_text())
    config.update(train_batch_size="auto", train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2)
    config["optimizer"]["params"]["lr"] = 5e-2
    del config["scheduler"]
    for key, value in changes.items():
        config[key] = value
    return config


def zero(stage: int, **extra: Any) -> dict[str, Any]:
    return {"stage": stage, **extra}


def plain(strategy: str, zero_stage: int, mixed_precision: str | None = None, cpu_offload: bool = False,
          clipping: float | None = 1.0, weight_decay: float = 0.01) -> dict[str, Any]:  # fmt: skip
    return {"micro": 4, "accumulation": 2, "strategy": strategy, "zero_stage": zero_stage,
            "mixed_precision": mixed_precision, "cpu_offload": cpu_offload, "clipping": clipping, "lr": 5e-2,
            "weight_decay": weight_decay}  # fmt: skip


def _bf16(config: dict[str, Any]) -> dict[str, Any]:
    config = copy.deepcopy(config)
    config["fp16"]["enabled"] = False
    config["bf16"] = {"enabled": True}
    return config


SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # The seed's ZeRO-3 config with CPU offload of optimizer and parameters, in bf16 (fp16 below).
    "seed zero3 offload bf16": (_bf16(seed_config()), plain("fsdp", 3, "bf16", cpu_offload=True)),
    "zero2 fp32": (
        seed_config(fp16={"enabled": False}, zero_optimization=zero(2), gradient_clipping=0.5),
        plain("fsdp", 2, clipping=0.5),
    ),
    "zero1 maps to zero2": (
        seed_config(fp16={"enabled": False}, zero_optimization=zero(1)), plain("fsdp", 2),
    ),
    "zero0 is ddp": (
        seed_config(fp16={"enabled": False}, zero_optimization=zero(0), gradient_clipping=0), plain("ddp", 0, clipping=None),
    ),
}


@pytest.fixture(scope="module")
def results(distributed) -> dict[str, Any]:
    ranks = distributed(
        "dist_workers_deepspeed:compare_all", nproc=2, kwargs={"scenarios": SCENARIOS, "steps": STEPS}, timeout=240
    )
    return ranks[0]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_engine_trains_like_the_plain_settings_it_maps_to(results, scenario):
    got = results[scenario]
    assert len(got["engine"]) == STEPS
    losses = got["engine"]
    assert sum(losses[-3:]) < 0.75 * sum(losses[:3]), f"did not train: {losses}"
    assert got["engine"] == pytest.approx(got["plain"], rel=1e-6)


def test_the_seed_config_maps_to_fsdp_full_shard_with_offload(results):
    settings = results["seed zero3 offload bf16"]["settings"]
    assert (settings.strategy, settings.fsdp_zero_stage, settings.cpu_offload) == ("fsdp", 3, True)
    assert (settings.mixed_precision, settings.gradient_clipping) == ("bf16", 1.0)
    assert (settings.micro_batch_size, settings.gradient_accumulation_steps, settings.train_batch_size) == (4, 2, 16)
    assert settings.world_size == 2
    assert results["zero1 maps to zero2"]["settings"].fsdp_zero_stage == 2


@pytest.mark.parametrize("stage", [0, 3])
def test_fp16_with_dynamic_loss_scaling_trains_and_ranks_agree_on_the_scale(distributed, stage):
    config = seed_config(zero_optimization=zero(stage))
    config["fp16"]["initial_scale_power"] = 20  # overflows at first, so the scale must come down on both ranks
    ranks = distributed("dist_workers_deepspeed:fp16_run", nproc=2, kwargs={"config": config, "steps": STEPS})
    first, second = ranks
    assert first["type"] == ("ShardedGradScaler" if stage else "GradScaler")
    assert 1 <= first["skipped"] <= STEPS // 2, "a 2**20 scale should overflow fp16 gradients a few times"
    assert (first["skipped"], first["scale"]) == (second["skipped"], second["scale"])
    assert first["scale"] < 2**20
    losses = first["losses"]
    assert sum(losses[-3:]) < 0.75 * sum(losses[:3]), losses


@pytest.mark.parametrize(("stage", "expected"), [(1, "Parameter"), (2, "Parameter"), (3, "DTensor"), (0, "Parameter")])
def test_zero_stage_decides_whether_blocks_reshard_after_forward(distributed, stage, expected):
    """Stages 1-2 keep the gathered parameters (plain) through backward, stage 3 reshards them (DTensor); DDP never shards."""
    config = seed_config(fp16={"enabled": False}, zero_optimization=zero(stage))
    ranks = distributed("dist_workers_deepspeed:block_weight_after_forward", nproc=2, kwargs={"config": config})
    assert ranks == [expected, expected]
