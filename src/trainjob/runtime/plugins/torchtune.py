"""torchtune, as Kubeflow Trainer v2.3 runs its BuiltinTrainer: the part of the torch plugin that a trainer command of
exactly ``tune run`` switches on (Kubeflow keeps it in the torch plugin's package, ``torchtune.go``).

The SDK's ``BuiltinTrainer`` sends ``command: [tune, run]`` and the fine-tuning settings as ``args``
(:func:`trainjob.sdk.builtin_trainers.builtin_trainer_fields`); the runtime is one of ``torchtune-<model>-<size>``
(``runtime/builtin/torchtune-*.yaml``). :func:`torchtune_command` completes the command, in this order:
``--rdzv_endpoint={job}-node-0-0.{job}:29500`` (only for several nodes or processes), the recipe, ``--config``
and the config, then the runtime's own settings of :data:`~trainjob.constants.TORCHTUNE_IMMUTABLE_CONFIGS`.

Recipe and config (:func:`recipe_and_config`; the config is the model plus the suffix; LoRA: an arg names
``model.lora_attn_modules``; QLoRA: ``model.quantize_base=True`` without ``model.use_dora=True``):

=================================================  ===============================  ===========================
nodes, processes                                   recipe                           config suffix
=================================================  ===============================  ===========================
1 node, ``numProcPerNode`` 1 or exactly 1 GPU      ``full_finetune_single_device``  ``_full_single_device``
  ... with LoRA / QLoRA                            ``lora_finetune_single_device``  ``_lora_single_device`` /
                                                                                    ``_qlora_single_device``
1 node, more processes, with QLoRA / LoRA          ``lora_finetune_distributed``    ``_qlora`` / ``_lora``
1 node, more processes                             ``full_finetune_distributed``    ``_full``
several nodes (LoRA refused)                       ``full_finetune_distributed``    ``_full_multinode``
=================================================  ===============================  ===========================

:func:`validate_torchtune` refuses, with Kubeflow's messages and field paths: a runtime name whose model is not
supported (``spec.runtimeRef.name``); several nodes for any model but ``llama3_3/70B`` (``spec.trainer.numNodes``);
QLoRA for ``qwen2_5/1.5B``; QLoRA on more than one device for the Llama 3.2 models (``numProcPerNode`` and
``resourcesPerNode``); LoRA on several nodes; and an arg that sets a config the runtime owns (``spec.trainer.args[i]``).
As in Kubeflow, validation counts the job's ``numNodes`` (1 when unset) and ``numProcPerNode`` (``auto`` when unset),
while the command is built from the resolved node count and, for ``auto`` without GPUs, the CPU count.

>>> model_from_runtime_name("torchtune-qwen2.5-1.5b")
'qwen2_5/1.5B'
>>> recipe_and_config(1, "auto", 4, ["model.lora_attn_modules=[q_proj]"], "torchtune-llama3.2-1b")
('lora_finetune_distributed', 'llama3_2/1B_lora')
"""

from __future__ import annotations

import json
from typing import Any

from trainjob.api import Runtime, TrainJob
from trainjob.api.quantity import cpu_count, is_gpu_resource, parse_quantity
from trainjob.constants import (
    ANCESTOR_STEP_LABEL,
    TORCHTUNE_ARG_CONFIG,
    TORCHTUNE_ARG_RDZV_ENDPOINT,
    TORCHTUNE_ENTRYPOINT,
    TORCHTUNE_FULL_FINETUNE_DISTRIBUTED,
    TORCHTUNE_FULL_FINETUNE_SINGLE_DEVICE,
    TORCHTUNE_FULL_MULTI_DEVICES_SUFFIX,
    TORCHTUNE_FULL_MULTI_NODES_SUFFIX,
    TORCHTUNE_FULL_SINGLE_DEVICE_SUFFIX,
    TORCHTUNE_IMMUTABLE_CONFIGS,
    TORCHTUNE_LORA_ATTN_MODULES,
    TORCHTUNE_LORA_DISTRIBUTED_SUFFIX,
    TORCHTUNE_LORA_FINETUNE_DISTRIBUTED,
    TORCHTUNE_LORA_FINETUNE_SINGLE_DEVICE,
    TORCHTUNE_LORA_SINGLE_DEVICE_SUFFIX,
    TORCHTUNE_MODEL_LLAMA3_2_1B,
    TORCHTUNE_MODEL_LLAMA3_2_3B,
    TORCHTUNE_MODEL_LLAMA3_3_70B,
    TORCHTUNE_MODEL_QWEN2_5_1_5B,
    TORCHTUNE_QLORA_DISTRIBUTED_SUFFIX,
    TORCHTUNE_QLORA_SINGLE_DEVICE_SUFFIX,
    TORCHTUNE_QUANTIZE_BASE,
    TORCHTUNE_SUPPORTED_MODELS,
    TORCHTUNE_USE_DORA,
    TRAINER_CONTAINER,
    TRAINER_STEP,
)
from trainjob.errors import ValidationError
from trainjob.runtime.plan import Plan, Resources

#: ``numProcPerNode`` as Kubeflow's torchtune code sees it: an integer, or ``"auto"``.
ProcSetting = int | str


def is_torchtune_job(trainjob: TrainJob) -> bool:
    """Whether the job's trainer command is exactly ``tune run`` (Kubeflow's switch; the runtime's label is not)."""
    trainer = trainjob.spec.trainer
    return trainer is not None and tuple(trainer.command or ()) == TORCHTUNE_ENTRYPOINT


def model_from_runtime_name(name: str) -> str:
    """The model of a ``torchtune-<model>-<size>`` runtime name; ``""`` when the name has not three parts."""
    parts = name.split("-")
    if len(parts) != 3:
        return ""
    return f"{parts[1].replace('.', '_')}/{parts[2].upper()}"


def uses_lora(args: list[str]) -> bool:
    """Some arg mentions ``model.lora_attn_modules``."""
    return any(TORCHTUNE_LORA_ATTN_MODULES in arg for arg in args)


def uses_qlora(args: list[str]) -> bool:
    """``model.quantize_base`` is true and DoRA (``model.use_dora``) is not."""
    return not _bool_arg_enabled(args, TORCHTUNE_USE_DORA) and _bool_arg_enabled(args, TORCHTUNE_QUANTIZE_BASE)


def _bool_arg_enabled(args: list[str], item: str) -> bool:
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and item in key and value.strip().lower() == "true":
            return True
    return False


def recipe_and_config(
    num_nodes: int, num_proc_per_node: ProcSetting, gpus: int, args: list[str], runtime_name: str
) -> tuple[str, str]:
    """The recipe and config for the node count, processes per node, GPUs per node and args (table above)."""
    single_device = num_proc_per_node == 1 or gpus == 1
    if num_nodes == 1 and single_device:
        if uses_qlora(args):
            recipe, suffix = TORCHTUNE_LORA_FINETUNE_SINGLE_DEVICE, TORCHTUNE_QLORA_SINGLE_DEVICE_SUFFIX
        elif uses_lora(args):
            recipe, suffix = TORCHTUNE_LORA_FINETUNE_SINGLE_DEVICE, TORCHTUNE_LORA_SINGLE_DEVICE_SUFFIX
        else:
            recipe, suffix = TORCHTUNE_FULL_FINETUNE_SINGLE_DEVICE, TORCHTUNE_FULL_SINGLE_DEVICE_SUFFIX
    elif num_nodes == 1 and uses_qlora(args):
        recipe, suffix = TORCHTUNE_LORA_FINETUNE_DISTRIBUTED, TORCHTUNE_QLORA_DISTRIBUTED_SUFFIX
    elif num_nodes == 1 and uses_lora(args):
        recipe, suffix = TORCHTUNE_LORA_FINETUNE_DISTRIBUTED, TORCHTUNE_LORA_DISTRIBUTED_SUFFIX
    elif num_nodes > 1:
        recipe, suffix = TORCHTUNE_FULL_FINETUNE_DISTRIBUTED, TORCHTUNE_FULL_MULTI_NODES_SUFFIX
    else:
        recipe, suffix = TORCHTUNE_FULL_FINETUNE_DISTRIBUTED, TORCHTUNE_FULL_MULTI_DEVICES_SUFFIX
    return recipe, model_from_runtime_name(runtime_name) + suffix


def gpus_per_node(resources: Resources) -> int:
    """GPUs of the trainer container as Kubeflow counts them: the requests' GPU resource, else the limits'."""
    for side in (resources.requests, resources.limits):
        count = next((int(-(-parse_quantity(q) // 1)) for name, q in side.items() if is_gpu_resource(name)), 0)
        if count > 0:
            return count
    return 0


def validate_torchtune(trainjob: TrainJob, resources: Resources) -> list[ValidationError]:
    """Kubeflow's torchtune checks of a ``tune run`` job whose trainer container has ``resources``."""
    trainer = trainjob.spec.trainer
    assert trainer is not None  # is_torchtune_job
    args = list(trainer.args or [])
    runtime_name = trainjob.spec.runtime_ref.name
    model = model_from_runtime_name(runtime_name)
    num_nodes = trainer.num_nodes or 1
    setting: ProcSetting = trainer.num_proc_per_node if isinstance(trainer.num_proc_per_node, int) else "auto"
    problems: list[ValidationError] = []
    if model not in TORCHTUNE_SUPPORTED_MODELS:
        problems.append(_invalid("spec.runtimeRef.name", runtime_name,
                                 f"must have a supported pretrained model, invalid model configured: {model}"))
    if num_nodes > 1 and model != TORCHTUNE_MODEL_LLAMA3_3_70B:
        problems.append(_invalid("spec.trainer.numNodes", num_nodes, f"must be 1 for {model} model"))
    _, config = recipe_and_config(num_nodes, setting, gpus_per_node(resources), args, runtime_name)
    if TORCHTUNE_QLORA_DISTRIBUTED_SUFFIX in config:
        if model == TORCHTUNE_MODEL_QWEN2_5_1_5B:
            problems.append(_invalid("spec.runtimeRef.name", runtime_name,
                                     f"QLoRA is not supported for {model} model"))
        llama3_2 = model in (TORCHTUNE_MODEL_LLAMA3_2_1B, TORCHTUNE_MODEL_LLAMA3_2_3B)
        if TORCHTUNE_QLORA_SINGLE_DEVICE_SUFFIX not in config and llama3_2:
            job_resources = trainer.resources_per_node.to_dict() if trainer.resources_per_node else None
            problems += [
                _invalid("spec.trainer.numProcPerNode", setting,
                         f"must be auto or 1 for {model} model when using QLoRA"),
                _invalid("spec.trainer.resourcesPerNode", job_resources,
                         f"must have gpu resource with value 1 for {model} model when using QLoRA"),
            ]
    # torchtune has no multi-node LoRA recipe: selection would silently fall back to full fine-tuning.
    if num_nodes > 1 and (uses_lora(args) or uses_qlora(args)):
        problems.append(_invalid("spec.trainer.numNodes", num_nodes,
                                 "LoRA fine-tuning is not supported for multi-node training in TorchTune"))
    for i, arg in enumerate(args):
        key = arg.split("=", 1)[0]
        if key in TORCHTUNE_IMMUTABLE_CONFIGS:
            problems.append(_invalid(f"spec.trainer.args[{i}]", arg,
                                     f'must not set immutable config "{key}" in trainer args; '
                                     "it is managed by the runtime"))
    return problems


def torchtune_command(trainjob: TrainJob, runtime: Runtime, plan: Plan, resources: Resources) -> list[str]:
    """The trainer command of a ``tune run`` job: rendezvous endpoint when distributed, recipe, ``--config``,
    config, then the runtime's immutable settings (Kubeflow's ``EnforceMLPolicy`` for torchtune)."""
    trainer = trainjob.spec.trainer
    assert trainer is not None  # is_torchtune_job
    gpus = gpus_per_node(resources)
    setting: ProcSetting = trainer.num_proc_per_node if isinstance(trainer.num_proc_per_node, int) else "auto"
    if setting == "auto" and gpus == 0:
        setting = cpu_count(resources.effective().get("cpu"))
    command = list(trainer.command or ())
    distributed = setting > 1 if isinstance(setting, int) else gpus > 1
    if plan.num_nodes > 1 or distributed:
        command.append(f"{TORCHTUNE_ARG_RDZV_ENDPOINT}={plan.master_addr()}:{plan.master_port}")
    recipe, config = recipe_and_config(plan.num_nodes, setting, gpus, list(trainer.args or []), runtime.name)
    return [*command, recipe, TORCHTUNE_ARG_CONFIG, config, *runtime_overrides(runtime)]


def runtime_overrides(runtime: Runtime) -> list[str]:
    """The runtime trainer container's command items that set an immutable config (``output_dir=...``), in order."""
    overrides: list[str] = []
    for job in runtime.spec.template.spec.replicated_jobs:
        labels = (job.template.get("metadata") or {}).get("labels") or {}
        if labels.get(ANCESTOR_STEP_LABEL) != TRAINER_STEP:  # Kubeflow reads the labelled job only
            continue
        containers = ((job.template.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
        for container in containers:
            if container.get("name") == TRAINER_CONTAINER:
                overrides += [c for c in container.get("command") or [] if c.split("=")[0] in TORCHTUNE_IMMUTABLE_CONFIGS]
    return overrides


def _invalid(path: str, value: Any, detail: str) -> ValidationError:
    """Kubernetes' ``field.Invalid`` as Kubeflow's webhook words it: ``Invalid value: <value>: <detail>``."""
    shown = json.dumps(value, separators=(",", ":")) if not isinstance(value, int) else str(value)
    return ValidationError(path, f"Invalid value: {shown}: {detail}")
