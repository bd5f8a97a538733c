"""trainjob's BuiltinTrainer is the Kubeflow SDK's: the same fields and defaults, the same ``spec.trainer``."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from kubeflow.trainer.backends.kubernetes import utils as kf_utils
from kubeflow.trainer.constants import constants as kf_constants
from kubeflow.trainer.types import types as kf

import trainjob
from trainjob.api.quantity import parse_quantity
from trainjob.errors import ValidationError
from trainjob.sdk import builtin_trainers as tj
from trainjob.sdk import initializers as tj_init
from trainjob.sdk.trainers import check_builtin_runtime
from trainjob.sdk.types import Runtime, RuntimeTrainer

NAMES = ["BuiltinTrainer", "TorchTuneConfig", "LoraConfig", "TorchTuneInstructDataset"]
ENUMS = ["DataType", "Loss", "DataFormat"]


@pytest.mark.parametrize("name", NAMES)
def test_dataclass_fields_and_defaults_are_kubeflows(name):
    def shape(cls):
        return [(f.name, f.default, f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
                for f in dataclasses.fields(cls)]

    assert shape(getattr(tj, name)) == shape(getattr(kf, name))


@pytest.mark.parametrize("name", ENUMS)
def test_enum_values_are_kubeflows(name):
    assert {m.name: m.value for m in getattr(tj, name)} == {m.name: m.value for m in getattr(kf, name)}


def test_the_six_names_are_exported_from_trainjob():
    for name in ("BuiltinTrainer", "TorchTuneConfig", "LoraConfig", "TorchTuneInstructDataset", "DataType", "Loss"):
        assert getattr(trainjob, name) is getattr(tj, name)
        assert name in trainjob.__all__


def _convert(value: Any, module: Any) -> Any:
    """A trainjob SDK value rebuilt with the same field values from ``module``'s classes (enums by name)."""
    if isinstance(value, tj.Enum):
        return getattr(module, type(value).__name__)[value.name]
    if dataclasses.is_dataclass(value):
        cls = getattr(module, type(value).__name__)
        return cls(**{f.name: _convert(getattr(value, f.name), module) for f in dataclasses.fields(value)})
    return value


def _quantities(fields: dict[str, Any]) -> dict[str, Any]:
    # The Kubeflow SDK keeps quantities as given (2 -> 2.0); trainjob writes Kubernetes quantity strings.
    res = fields.get("resourcesPerNode")
    if res:
        fields["resourcesPerNode"] = {side: {k: parse_quantity(str(v)) for k, v in values.items()}
                                      for side, values in res.items()}
    return fields


CONFIGS = [
    ("defaults", tj.TorchTuneConfig(), None),
    ("training settings", tj.TorchTuneConfig(dtype=tj.DataType.BF16, batch_size=8, epochs=2,
                                             loss=tj.Loss.CEWithChunkedOutputLoss, num_nodes=2,
                                             resources_per_node={"GPU": 2, "cpu": "4", "Memory": "16Gi"}), None),
    ("LoRA", tj.TorchTuneConfig(peft_config=tj.LoraConfig(lora_rank=8, lora_alpha=16, lora_dropout=0.1,
                                                          apply_lora_to_mlp=True)), None),
    ("QLoRA and DoRA off", tj.TorchTuneConfig(peft_config=tj.LoraConfig(quantize_base=True, use_dora=False,
                                                                        lora_attn_modules=["q_proj"])), None),
    ("instruct dataset", tj.TorchTuneConfig(dataset_preprocess_config=tj.TorchTuneInstructDataset(
        source=tj.DataFormat.JSON, split="train[:10%]", train_on_input=False, new_system_prompt="Be brief.",
        column_map={"input": "question", "output": "answer"})), None),
    ("dataset directory", tj.TorchTuneConfig(epochs=1), "tatsu-lab/alpaca"),
    ("dataset file", tj.TorchTuneConfig(epochs=1), "hf://org/data/train/part.json"),
    ("MIG", tj.TorchTuneConfig(resources_per_node={"mig-1g.5gb": 1, "storage": "10Gi"}), None),
]


@pytest.mark.parametrize(("case", "config", "dataset_uri"), CONFIGS, ids=[c[0] for c in CONFIGS])
def test_spec_trainer_equals_the_kubeflow_sdks(case, config, dataset_uri):
    trainer = tj.BuiltinTrainer(config=config)
    ours_init = kf_init = None
    if dataset_uri:
        ours_init = tj_init.Initializer(dataset=tj_init.HuggingFaceDatasetInitializer(storage_uri=dataset_uri))
        kf_init = kf.Initializer(dataset=kf.HuggingFaceDatasetInitializer(storage_uri=dataset_uri))
    runtime = kf.Runtime(name="torchtune-llama3.2-1b", kind=kf.RuntimeKind.CLUSTER_TRAINING_RUNTIME,
                         trainer=kf.RuntimeTrainer(trainer_type=kf.TrainerType.BUILTIN_TRAINER,
                                                   framework="torchtune", image="x"))
    runtime.trainer.set_command(kf_constants.TORCH_TUNE_COMMAND)
    theirs = kf_utils.get_trainer_cr_from_builtin_trainer(runtime, _convert(trainer, kf), kf_init).to_dict()
    ours = tj.builtin_trainer_fields(trainer, ours_init)
    assert _quantities(ours) == _quantities(theirs)


def test_gpus_and_mig_together_are_refused_as_kubeflow_refuses_them():
    config = tj.TorchTuneConfig(resources_per_node={"gpu": 1, "mig-1g.5gb": 1})
    with pytest.raises(ValueError, match=r"GPU \(nvidia.com/gpu\) and MIG \(nvidia.com/mig-1g.5gb\) cannot"):
        kf_utils.get_resources_per_node(config.resources_per_node)
    with pytest.raises(ValidationError, match=r"GPU \(nvidia.com/gpu\) and MIG \(nvidia.com/mig-1g.5gb\) cannot"):
        tj.builtin_trainer_fields(tj.BuiltinTrainer(config=config))


def test_a_builtin_trainer_needs_a_torchtune_runtime():
    torch = Runtime(name="torch-distributed", trainer=RuntimeTrainer("CustomTrainer", "torch", "img"))
    with pytest.raises(ValidationError, match="runtime: BuiltinTrainer can't be used with .* runtime"):
        check_builtin_runtime(torch)
    check_builtin_runtime(Runtime(name="torchtune-llama3.2-1b",
                                  trainer=RuntimeTrainer("BuiltinTrainer", "torchtune", "img")))
