"""Each ds_config key maps to the trainjob setting the table in trainjob.torch.deepspeed_config promises."""

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from trainjob.errors import ValidationError
from trainjob.torch.deepspeed_config import LossScaling, map_deepspeed_config
from trainjob.torch.deepspeed_engine import deepspeed_optimizer, deepspeed_scheduler

SEED_CONFIG = Path(__file__).parent / "deepspeed_configs" / "seed003_ds_config.json"
BATCH = {"train_micro_batch_size_per_gpu": 2}


def mapped(config: dict[str, Any], world_size: int = 1) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a mapped key must not be reported as unknown
        return map_deepspeed_config({**BATCH, **config}, world_size=world_size)


def test_the_seed_config_file_maps_to_fsdp_full_shard_offload_fp16():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings = map_deepspeed_config(SEED_CONFIG, world_size=8)  # 256 = 4 × 8 × 8
    assert settings.source == str(SEED_CONFIG)
    assert (settings.zero_stage, settings.strategy, settings.fsdp_zero_stage, settings.cpu_offload) == (3, "fsdp", 3, True)
    assert settings.mixed_precision == "fp16"
    assert settings.loss_scaling == LossScaling(dynamic=True, init_scale=2.0**16, growth_interval=1000)
    assert (settings.micro_batch_size, settings.gradient_accumulation_steps, settings.train_batch_size) == (4, 8, 256)
    assert settings.gradient_clipping == 1.0
    assert settings.optimizer["type"] == "AdamW" and settings.scheduler["type"] == "WarmupDecayLR"
    assert settings.used["zero_optimization.offload_param.device"] == "cpu"
    assert "zero_optimization.stage3_max_live_parameters" in settings.ignored
    assert {"flops_profiler", "fp16.hysteresis", "fp16.min_loss_scale"} <= set(settings.ignored)
    assert settings.unknown == [] and settings.auto == []


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, {"zero_stage": 0, "strategy": "ddp", "fsdp_zero_stage": None, "cpu_offload": False}),
        ({"zero_optimization": {"stage": 0}}, {"strategy": "ddp", "fsdp_zero_stage": None}),
        ({"zero_optimization": {"stage": 1}}, {"strategy": "fsdp", "fsdp_zero_stage": 2}),
        ({"zero_optimization": {"stage": 2}}, {"strategy": "fsdp", "fsdp_zero_stage": 2}),
        ({"zero_optimization": {"stage": 3}}, {"strategy": "fsdp", "fsdp_zero_stage": 3}),
        ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}},
         {"cpu_offload": True}),
        ({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}, {"cpu_offload": True}),
        ({"zero_optimization": {"stage": 3, "offload_param": {"device": "none"}}}, {"cpu_offload": False}),
        ({"zero_optimization": {"stage": 1, "cpu_offload": True}}, {"cpu_offload": True}),
        ({"bf16": {"enabled": True}}, {"mixed_precision": "bf16", "loss_scaling": None}),
        ({"fp16": {"enabled": False}, "bf16": {"enabled": False}}, {"mixed_precision": None}),
        ({"fp16": {"enabled": True}},
         {"mixed_precision": "fp16", "loss_scaling": LossScaling(True, 2.0**16, 1000)}),
        ({"fp16": {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 50}},
         {"loss_scaling": LossScaling(True, 256.0, 50)}),
        ({"fp16": {"enabled": True, "loss_scale": 128}}, {"loss_scaling": LossScaling(False, 128.0, 1000)}),
        ({"gradient_clipping": 0.5}, {"gradient_clipping": 0.5}),
        ({"gradient_clipping": 0}, {"gradient_clipping": None}),
        ({"gradient_accumulation_steps": 4}, {"gradient_accumulation_steps": 4, "train_batch_size": 8}),
    ],
)
def test_each_key_maps_to_its_trainjob_setting(config, expected):
    settings = mapped(config)
    assert {key: getattr(settings, key) for key in expected} == expected


@pytest.mark.parametrize(
    ("config", "world", "micro", "accumulation", "total"),
    [
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4, 4, 2, 32),
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 4, 4, 2, 32),
        ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4, 4, 2, 32),
        ({"train_batch_size": 32}, 4, 8, 1, 32),
        ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4, 4, 2, 32),
        ({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4, 4, 2, 32),
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}, 2, 16, 1, 32),
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto"}, 2, 4, 4, 32),
    ],
)
def test_batch_sizes_follow_micro_times_accumulation_times_world(config, world, micro, accumulation, total):
    settings = map_deepspeed_config(config, world_size=world)
    assert (settings.micro_batch_size, settings.gradient_accumulation_steps, settings.train_batch_size) == (
        micro, accumulation, total,
    )  # fmt: skip
    assert micro * accumulation * world == total


def test_auto_values_are_resolved_and_listed():
    config = {
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.1}},
    }  # fmt: skip
    settings = map_deepspeed_config(config, world_size=2)
    assert (settings.micro_batch_size, settings.gradient_accumulation_steps, settings.train_batch_size) == (4, 1, 8)
    assert (settings.gradient_clipping, settings.mixed_precision) == (None, None)
    assert settings.auto == [
        "fp16.enabled", "bf16.enabled", "train_batch_size", "gradient_accumulation_steps", "gradient_clipping",
        "optimizer.params.lr",
    ]  # fmt: skip
    assert "zero_optimization.reduce_bucket_size" in settings.ignored
    model = torch.nn.Linear(3, 1)
    assert deepspeed_optimizer(model, settings).param_groups[0]["lr"] == 1e-3  # torch's default
    assert deepspeed_optimizer(model, settings, lr=0.25).param_groups[0]["lr"] == 0.25


def test_inconsistent_batch_sizes_name_the_rule_and_the_numbers():
    config = {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    with pytest.raises(ValidationError) as err:
        map_deepspeed_config(config, world_size=4)
    assert str(err.value) == (
        "deepspeed_config: train_batch_size: must equal train_micro_batch_size_per_gpu × gradient_accumulation_steps"
        ' × world size (4 × 2 × 4 = 32), got 30; set one of them to "auto" to derive it'
    )
    with pytest.raises(ValidationError, match=r"must be a multiple of train_micro_batch_size_per_gpu × world size \(4 × 4 = 16\)"):
        map_deepspeed_config({"train_batch_size": 40, "train_micro_batch_size_per_gpu": 4}, world_size=4)


def test_unknown_keys_are_named_in_one_warning(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**BATCH, "zero_optimisation": {"stage": 3}, "fp16": {"enabled": True, "scale": 2},
                                "steps_per_print": 10}))  # fmt: skip
    with pytest.warns(UserWarning) as caught:
        settings = map_deepspeed_config(path)
    assert len(caught) == 1
    assert str(caught[0].message) == f"{path}: ignoring keys trainjob does not know: zero_optimisation, fp16.scale"
    assert settings.unknown == ["zero_optimisation", "fp16.scale"]
    assert settings.ignored == ["steps_per_print"] and settings.zero_stage == 0


def test_bad_json_names_the_file_line_and_column(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text('{\n  "train_batch_size": 8,\n  "fp16": {"enabled": true,}\n}\n')
    with pytest.raises(ValidationError) as err:
        map_deepspeed_config(path)
    assert str(err.value) == f"{path}: is not valid JSON: line 3, column 28: Expecting property name enclosed in double quotes"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"zero_optimization": {"stage": 4}}, "deepspeed_config: zero_optimization.stage: must be 0, 1, 2 or 3, got 4"),
        ({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
         "deepspeed_config: zero_optimization.offload_optimizer: needs zero_optimization.stage 1, 2 or 3"),
        ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
         "deepspeed_config: zero_optimization.offload_param: needs zero_optimization.stage 3, got stage 2"),
        ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"}}},
         'deepspeed_config: zero_optimization.offload_param.device: must be "cpu" or "none" (no NVMe offload here), '
         "got 'nvme'"),
        ({"fp16": {"enabled": True}, "bf16": {"enabled": True}},
         "deepspeed_config: fp16.enabled: and bf16.enabled are both true: enable one of them"),
        ({"amp": {"enabled": True}}, 'deepspeed_config: amp.enabled: NVIDIA Apex AMP is not available here'),
        ({"fp16": {"enabled": "yes"}}, "deepspeed_config: fp16.enabled: must be true, false or \"auto\", got 'yes'"),
        ({"gradient_clipping": -1}, 'deepspeed_config: gradient_clipping: must be a number >= 0 (0: no clipping) or "auto", got -1'),
        ({"gradient_accumulation_steps": 0}, 'deepspeed_config: gradient_accumulation_steps: must be an integer >= 1 or "auto", got 0'),
        ({"optimizer": {"params": {"lr": 1}}}, "deepspeed_config: optimizer.type: must name the optimizer, got None"),
    ],
)
def test_bad_values_name_the_key_and_what_is_accepted(config, message):
    with pytest.raises(ValidationError) as err:
        map_deepspeed_config({**BATCH, **config}, world_size=1)
    assert str(err.value).startswith(message)


def test_missing_batch_sizes_and_files_are_refused(tmp_path):
    with pytest.raises(ValidationError, match=r"train_batch_size: give train_batch_size or train_micro_batch_size_per_gpu"):
        map_deepspeed_config({"gradient_accumulation_steps": 2}, world_size=1)
    with pytest.raises(ValidationError, match=r"^deepspeed_config: no such file: .*missing.json$"):
        map_deepspeed_config(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValidationError, match=r"list.json: must hold a JSON object, got list"):
        map_deepspeed_config(tmp_path / "list.json")


@pytest.mark.parametrize(
    ("block", "cls", "expected"),
    [
        ({"type": "Adam", "params": {"lr": 0.1, "betas": [0.8, 0.9], "eps": 1e-6, "weight_decay": 0.01}},
         torch.optim.AdamW, {"lr": 0.1, "betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.01}),
        ({"type": "Adam", "params": {"lr": 0.1, "adam_w_mode": False}}, torch.optim.Adam, {"lr": 0.1, "weight_decay": 0.0}),
        ({"type": "AdamW", "params": {"lr": 0.1}}, torch.optim.AdamW, {"weight_decay": 0.0}),
        ({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
        ({"type": "Adagrad", "params": {"lr": 0.1}}, torch.optim.Adagrad, {"lr": 0.1}),
    ],
)
def test_optimizer_block_builds_the_torch_optimizer(block, cls, expected):
    optimizer = deepspeed_optimizer(torch.nn.Linear(3, 1), mapped({"optimizer": block}))
    assert type(optimizer) is cls
    group = optimizer.param_groups[0]
    assert {key: group[key] for key in expected} == expected


def test_unsupported_optimizer_and_scheduler_types_are_named():
    model = torch.nn.Linear(3, 1)
    with pytest.raises(ValidationError, match=r"optimizer.type: must be one of Adam, AdamW, SGD, Adagrad, got 'OneBitAdam'"):
        deepspeed_optimizer(model, mapped({"optimizer": {"type": "OneBitAdam", "params": {}}}))
    with pytest.raises(ValidationError, match=r"optimizer.params: .*unexpected keyword argument 'freeze_step'"):
        deepspeed_optimizer(model, mapped({"optimizer": {"type": "Adam", "params": {"freeze_step": 2}}}))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValidationError, match=r"scheduler.type: must be one of WarmupLR, WarmupDecayLR, WarmupCosineLR, got 'OneCycle'"):
        deepspeed_scheduler(optimizer, mapped({"scheduler": {"type": "OneCycle", "params": {}}}))
    with pytest.raises(ValidationError, match=r'scheduler.params.total_num_steps: is "auto": pass total_num_steps='):
        deepspeed_scheduler(optimizer, mapped({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}}))
    assert deepspeed_scheduler(optimizer, mapped({})) is None


def _lrs(block: dict[str, Any], steps: int, lr: float = 0.1) -> list[float]:
    """The learning rate each optimizer step uses."""
    optimizer = torch.optim.SGD(torch.nn.Linear(3, 1).parameters(), lr=lr)
    scheduler = deepspeed_scheduler(optimizer, mapped({"scheduler": block}))
    used = []
    for _ in range(steps):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return used


def test_schedules_follow_deepspeed_formulas():
    # WarmupDecayLR, linear warm-up over 4 steps to 0.1, then down to 0 at step 8; the first step runs at the minimum.
    linear = {"warmup_min_lr": 0, "warmup_max_lr": 0.1, "warmup_num_steps": 4, "warmup_type": "linear"}
    got = _lrs({"type": "WarmupDecayLR", "params": {**linear, "total_num_steps": 8}}, 10)
    assert got == pytest.approx([0, 0, 0.025, 0.05, 0.075, 0.1, 0.075, 0.05, 0.025, 0.0])
    # WarmupLR, log warm-up (the default) from 0.01, max defaulting to the optimizer's lr.
    got = _lrs({"type": "WarmupLR", "params": {"warmup_min_lr": 0.01, "warmup_num_steps": 4}}, 6)
    gamma = [0, 0] + [math.log(i + 1) / math.log(4) for i in (1, 2)] + [1, 1]
    assert got == pytest.approx([0.01 + 0.09 * g for g in gamma])
    # WarmupCosineLR, a ratio of the optimizer's lr.
    got = _lrs({"type": "WarmupCosineLR", "params": {"total_num_steps": 6, "warmup_num_steps": 2, "warmup_type": "linear",
                                                     "cos_min_ratio": 0.0}}, 7, lr=1.0)  # fmt: skip
    cosine = [(1 + math.cos(math.pi * k / 4)) / 2 for k in (1, 2, 3, 4)]
    assert got == pytest.approx([0, 0, 0.5, *cosine])


def test_schedules_match_deepspeeds_own_when_it_is_installed():
    if os.environ.get("TRAINJOB_REQUIRE_DEEPSPEED"):
        import deepspeed.runtime.lr_schedules as lr_schedules
    else:
        lr_schedules = pytest.importorskip("deepspeed.runtime.lr_schedules", reason="DeepSpeed is not installed")
    cases = [
        ("WarmupLR", {"warmup_min_lr": 0.001, "warmup_max_lr": 0.05, "warmup_num_steps": 7}),
        ("WarmupDecayLR", {"warmup_min_lr": 0, "warmup_max_lr": 0.05, "warmup_num_steps": 5, "total_num_steps": 12}),
        ("WarmupDecayLR", {"warmup_max_lr": 0.05, "warmup_num_steps": 3, "total_num_steps": 9, "warmup_type": "linear"}),
        ("WarmupCosineLR", {"warmup_num_steps": 4, "total_num_steps": 10, "warmup_min_ratio": 0.1}),
    ]
    for kind, params in cases:
        theirs_optimizer = torch.optim.SGD(torch.nn.Linear(3, 1).parameters(), lr=0.1)
        theirs = getattr(lr_schedules, kind)(theirs_optimizer, **params)
        expected = []
        for _ in range(14):
            expected.append(theirs_optimizer.param_groups[0]["lr"])
            theirs_optimizer.step()
            theirs.step()
        assert _lrs({"type": kind, "params": params}, 14) == pytest.approx(expected, abs=1e-12), kind


@pytest.mark.parametrize(
    ("given", "name"),
    [({"strategy": "ddp"}, "strategy"), ({"mixed_precision": "bf16"}, "mixed_precision"),
     ({"cpu_offload": True}, "cpu_offload")],
)
def test_prepare_model_refuses_settings_the_config_decides(single_process, given, name):
    import trainjob.torch as tt

    with pytest.raises(ValidationError, match=rf"^{name}: comes from deepspeed_config: leave it out"):
        tt.prepare_model(torch.nn.Linear(3, 1), deepspeed_config={**BATCH}, **given)


def test_prepare_model_reads_a_config_file(single_process, tmp_path):
    from torch.distributed.fsdp import FSDPModule

    import trainjob.torch as tt

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({**BATCH, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}))
    model = tt.prepare_model(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)), deepspeed_config=path)
    assert isinstance(model, FSDPModule)
    out = model(torch.randn(2, 3))
    assert out.dtype == torch.float32  # bf16 compute, float32 handed to the loss
    path.write_text(json.dumps({**BATCH, "fp16": {"enabled": True}}))
    plain = tt.prepare_model(torch.nn.Linear(3, 1), deepspeed_config=path)
    assert not isinstance(plain, FSDPModule | torch.nn.parallel.DistributedDataParallel)  # one process: unwrapped
