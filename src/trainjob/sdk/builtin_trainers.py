"""The Kubeflow SDK's BuiltinTrainer (``kubeflow.trainer``, SDK 0.5): fine-tune an LLM on a torchtune runtime with
settings instead of a training function, with the SDK's names, fields and defaults::

    client.train(runtime="torchtune-llama3.2-1b",
                 trainer=BuiltinTrainer(config=TorchTuneConfig(epochs=1, peft_config=LoraConfig(lora_rank=8))))

:func:`builtin_trainer_fields` writes the job's ``spec.trainer`` as the Kubeflow SDK does: ``command: [tune, run]``
and the settings as torchtune config overrides in ``args``; the torch plugin picks the recipe and config
(:mod:`trainjob.runtime.plugins.torchtune`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import urlparse

from trainjob.constants import TORCHTUNE_ENTRYPOINT, TORCHTUNE_INSTRUCT_DATASET
from trainjob.errors import ValidationError

#: Where the dataset initializer puts the dataset in the trainer's pods.
DATASET_PATH = "/workspace/dataset"


class Loss(Enum):
    """Loss function of the torchtune trainer."""

    CEWithChunkedOutputLoss = "torchtune.modules.loss.CEWithChunkedOutputLoss"


class DataType(Enum):
    """Data type of the model and optimizer parameters."""

    BF16 = "bf16"
    FP32 = "fp32"


class DataFormat(Enum):
    """File type of an instruct dataset."""

    JSON = "json"
    CSV = "csv"
    PARQUET = "parquet"
    ARROW = "arrow"
    TEXT = "text"
    XML = "xml"


@dataclass
class TorchTuneInstructDataset:
    """How torchtune's ``instruct_dataset`` reads the dataset: file type, split, whether to train on the prompt, a
    system prompt to prepend, and which columns hold ``input`` and ``output``."""

    source: DataFormat | None = None
    split: str | None = None
    train_on_input: bool | None = None
    new_system_prompt: str | None = None
    column_map: dict[str, str] | None = None


@dataclass
class LoraConfig:
    """LoRA (QLoRA with ``quantize_base=True``, DoRA with ``use_dora=True``) for the attention modules named."""

    apply_lora_to_mlp: bool | None = None
    apply_lora_to_output: bool | None = None
    lora_attn_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj", "output_proj"])
    lora_rank: int | None = None
    lora_alpha: int | None = None
    lora_dropout: float | None = None
    quantize_base: bool | None = None
    use_dora: bool | None = None


@dataclass
class TorchTuneConfig:
    """The torchtune trainer's settings; unset ones keep the runtime's config."""

    dtype: DataType | None = None
    batch_size: int | None = None
    epochs: int | None = None
    loss: Loss | None = None
    num_nodes: int | None = None
    peft_config: LoraConfig | None = None
    dataset_preprocess_config: TorchTuneInstructDataset | None = None
    resources_per_node: dict | None = None


@dataclass
class BuiltinTrainer:
    """A trainer whose fine-tuning code ships in the runtime's image; only its ``config`` is set."""

    config: TorchTuneConfig


#: Resource names the Kubeflow SDK lower-cases and the ones it renames.
_STANDARD_RESOURCES = {"cpu", "memory", "gpu", "storage", "ephemeral-storage"}
_RESOURCE_ALIASES = {"gpu": "nvidia.com/gpu", "storage": "ephemeral-storage"}
_MIG_PREFIX = "nvidia.com/mig-"


def builtin_resources(resources: dict[str, Any]) -> dict[str, Any]:
    """``resourcesPerNode`` as the Kubeflow SDK writes it: requests equal to limits, ``gpu`` -> ``nvidia.com/gpu``,
    ``storage`` -> ``ephemeral-storage``, ``mig-<profile>`` -> ``nvidia.com/mig-<profile>`` (one kind, no GPUs)."""
    out: dict[str, Any] = {}
    for key, value in resources.items():
        name = key.lower() if key.lower() in _STANDARD_RESOURCES or key.lower().startswith("mig-") else key
        name = _RESOURCE_ALIASES.get(name, name)
        out[_MIG_PREFIX + name[len("mig-"):] if name.startswith("mig-") else name] = str(value)
    migs = [k for k in out if k.startswith(_MIG_PREFIX)]
    if len(migs) > 1:
        raise ValidationError("trainer.config.resources_per_node",
                              f"Multiple MIG resource types are not supported: {migs}")
    if migs and "nvidia.com/gpu" in out:
        raise ValidationError("trainer.config.resources_per_node",
                              f"GPU (nvidia.com/gpu) and MIG ({migs[0]}) cannot be requested together")
    return {"requests": out, "limits": dict(out)}


def builtin_trainer_fields(trainer: BuiltinTrainer, initializer: Any = None) -> dict[str, Any]:
    """``spec.trainer`` for ``trainer`` as the Kubeflow SDK builds it: ``numNodes`` and ``resourcesPerNode`` when
    set, ``command: [tune, run]``, and ``args`` (:func:`torchtune_args`)."""
    config = trainer.config
    if type(config).__name__ != "TorchTuneConfig":
        raise ValidationError("trainer.config", f"must be a TorchTuneConfig, got {config!r}")
    fields: dict[str, Any] = {}
    if config.num_nodes:
        fields["numNodes"] = config.num_nodes
    if config.resources_per_node:
        fields["resourcesPerNode"] = builtin_resources(config.resources_per_node)
    fields["command"] = list(TORCHTUNE_ENTRYPOINT)
    fields["args"] = torchtune_args(config, initializer)
    return fields


def torchtune_args(config: TorchTuneConfig, initializer: Any = None) -> list[str]:
    """The config overrides, in the Kubeflow SDK's order: dtype, batch size, epochs, loss, where the Hugging Face
    dataset lies (``dataset.data_files`` for a file, else ``dataset.data_dir``), LoRA, then the dataset's format."""
    args: list[str] = []
    if config.dtype:
        if not isinstance(config.dtype, Enum) or type(config.dtype).__name__ != "DataType":
            raise ValidationError("trainer.config.dtype", f"Invalid dtype: {config.dtype}.")
        args.append(f"dtype={config.dtype.value}")
    if config.batch_size:
        args.append(f"batch_size={config.batch_size}")
    if config.epochs:
        args.append(f"epochs={config.epochs}")
    if config.loss:
        args.append(f"loss={config.loss.value}")
    dataset = getattr(initializer, "dataset", None)
    if type(dataset).__name__ == "HuggingFaceDatasetInitializer":
        args.append(_dataset_location(dataset.storage_uri))
    if config.peft_config:
        args += _lora_args(config.peft_config)
    if config.dataset_preprocess_config:
        args += _dataset_args(config.dataset_preprocess_config)
    return args


def _dataset_location(storage_uri: str) -> str:
    uri = storage_uri if storage_uri.startswith("hf://") else "hf://" + storage_uri
    parts = urlparse(uri).path.strip("/").split("/")
    relative = "/".join(parts[1:]) if len(parts) > 1 else "."
    key = "dataset.data_files" if relative != "." and "." in relative else "dataset.data_dir"
    return f"{key}={os.path.join(DATASET_PATH, relative)}"


_LORA_ITEMS = {
    "apply_lora_to_mlp": "model.apply_lora_to_mlp",
    "apply_lora_to_output": "model.apply_lora_to_output",
    "lora_rank": "model.lora_rank",
    "lora_alpha": "model.lora_alpha",
    "lora_dropout": "model.lora_dropout",
    "quantize_base": "model.quantize_base",
    "use_dora": "model.use_dora",
}


def _lora_args(lora: LoraConfig) -> list[str]:
    if type(lora).__name__ != "LoraConfig":
        raise ValidationError("trainer.config.peft_config", f"Invalid PEFT config type: {type(lora)}.")
    args = [f"{item}={getattr(lora, name)}" for name, item in _LORA_ITEMS.items() if getattr(lora, name) is not None]
    if lora.lora_attn_modules:
        args.append(f"model.lora_attn_modules=[{','.join(lora.lora_attn_modules)}]")
    return args


def _dataset_args(dataset: TorchTuneInstructDataset) -> list[str]:
    if type(dataset).__name__ != "TorchTuneInstructDataset":
        raise ValidationError("trainer.config.dataset_preprocess_config",
                              f"Invalid dataset preprocess config type: {type(dataset)}.")
    args = [f"dataset={TORCHTUNE_INSTRUCT_DATASET}"]
    if dataset.source:
        args.append(f"dataset.source={dataset.source.value}")
    if dataset.split:
        args.append(f"dataset.split={dataset.split}")
    if dataset.train_on_input is not None:
        args.append(f"dataset.train_on_input={dataset.train_on_input}")
    if dataset.new_system_prompt:
        args.append(f"dataset.new_system_prompt={dataset.new_system_prompt}")
    if dataset.column_map:
        args.append(f"dataset.column_map={dataset.column_map}")
    return args
