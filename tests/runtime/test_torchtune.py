"""torchtune as Kubeflow Trainer v2.3 runs it: the cases of Kubeflow's torchtune_test.go, torch_test.go and
trainingruntime_test.go, as TrainJob + runtime in, the trainer's command or the errors out."""

from __future__ import annotations

import pytest

from trainjob.errors import ValidationError
from trainjob.runtime import builtin_runtimes, resolve
from trainjob.runtime.plugins.torchtune import model_from_runtime_name, recipe_and_config, uses_qlora

LORA = ["model.lora_attn_modules=[q_proj,v_proj,output_proj]"]
QLORA = [*LORA, "model.quantize_base=True"]
LLAMA_1B_PATHS = ["output_dir=/workspace/output", "tokenizer.path=/workspace/model/original/tokenizer.model",
                  "checkpointer.checkpoint_dir=/workspace/model"]
RDZV = "--rdzv_endpoint=test-job-node-0-0.test-job:29500"


def gpus(count: str, cpu: str = "1") -> dict:
    return {"requests": {"cpu": cpu, "example.com/gpu": count}}


@pytest.mark.parametrize(("name", "want"), [
    ("torchtune-llama3.2-1b", "llama3_2/1B"),
    ("torchtune-qwen2.5-1.5b", "qwen2_5/1.5B"),
    ("torchtune-llama3.2", ""),
    ("torchtune-llama3.2-1b-extra", ""),
    ("", ""),
])
def test_model_comes_from_the_runtime_name(name, want):
    assert model_from_runtime_name(name) == want


@pytest.mark.parametrize(("args", "want"), [
    (["model.quantize_base=True"], True),
    (["model.quantize_base=False"], False),
    (["model.quantize_base=True", "model.use_dora=True"], False),
    (["model.quantize_base=True", "model.use_dora=False"], True),
    (["batch_size=32"], False),
])
def test_qlora_needs_quantize_base_and_no_dora(args, want):
    assert uses_qlora(args) is want


@pytest.mark.parametrize(("nodes", "nproc", "gpu_count", "args", "want"), [
    (1, "auto", 1, [], ("full_finetune_single_device", "llama3_2/1B_full_single_device")),
    (1, "auto", 1, LORA, ("lora_finetune_single_device", "llama3_2/1B_lora_single_device")),
    (1, "auto", 1, ["model.quantize_base=True"], ("lora_finetune_single_device", "llama3_2/1B_qlora_single_device")),
    (1, "auto", 4, [], ("full_finetune_distributed", "llama3_2/1B_full")),
    (1, "auto", 4, LORA, ("lora_finetune_distributed", "llama3_2/1B_lora")),
    (1, "auto", 4, ["model.quantize_base=True"], ("lora_finetune_distributed", "llama3_2/1B_qlora")),
    (2, "auto", 8, [], ("full_finetune_distributed", "llama3_2/1B_full_multinode")),
    (1, 1, 4, [], ("full_finetune_single_device", "llama3_2/1B_full_single_device")),
    (1, 4, 4, [], ("full_finetune_distributed", "llama3_2/1B_full")),
])
def test_recipe_and_config_follow_nodes_devices_and_lora(nodes, nproc, gpu_count, args, want):
    assert recipe_and_config(nodes, nproc, gpu_count, args, "torchtune-llama3.2-1b") == want


# (case, runtime, trainer fields besides command, the trainer container's command after "tune run")
COMMANDS = [
    ("multi-GPU full fine-tuning", "torchtune-llama3.2-1b", {"resourcesPerNode": gpus("2")},
     [RDZV, "full_finetune_distributed", "--config", "llama3_2/1B_full", *LLAMA_1B_PATHS]),
    ("single device full fine-tuning", "torchtune-llama3.2-1b", {"numProcPerNode": 1, "resourcesPerNode": gpus("1")},
     ["full_finetune_single_device", "--config", "llama3_2/1B_full_single_device", *LLAMA_1B_PATHS]),
    ("LoRA on two GPUs", "torchtune-llama3.2-1b", {"args": LORA, "resourcesPerNode": gpus("2")},
     [RDZV, "lora_finetune_distributed", "--config", "llama3_2/1B_lora", *LLAMA_1B_PATHS]),
    ("QLoRA on one GPU", "torchtune-llama3.2-1b", {"args": QLORA, "resourcesPerNode": gpus("1")},
     ["lora_finetune_single_device", "--config", "llama3_2/1B_qlora_single_device", *LLAMA_1B_PATHS]),
    ("DoRA turns QLoRA off", "torchtune-llama3.2-1b",
     {"args": [*QLORA, "model.use_dora=True"], "resourcesPerNode": gpus("2")},
     [RDZV, "lora_finetune_distributed", "--config", "llama3_2/1B_lora", *LLAMA_1B_PATHS]),
    ("the runtime's two GPUs", "torchtune-llama3.2-3b", {},
     [RDZV, "full_finetune_distributed", "--config", "llama3_2/3B_full", "output_dir=/workspace/output",
      "tokenizer.path=/workspace/model/original/tokenizer.model", "checkpointer.checkpoint_dir=/workspace/model"]),
    ("qwen's tokenizer has a merges file", "torchtune-qwen2.5-1.5b", {},
     [RDZV, "full_finetune_distributed", "--config", "qwen2_5/1.5B_full", "output_dir=/workspace/output",
      "tokenizer.path=/workspace/model/vocab.json", "tokenizer.merges_file=/workspace/model/merges.txt",
      "checkpointer.checkpoint_dir=/workspace/model"]),
    ("auto without GPUs counts CPUs", "torchtune-llama3.2-1b", {"resourcesPerNode": {"requests": {"cpu": "1"}}},
     ["full_finetune_single_device", "--config", "llama3_2/1B_full_single_device", *LLAMA_1B_PATHS]),
]


@pytest.mark.parametrize(("case", "runtime", "trainer", "want"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_tune_run_is_completed_with_rendezvous_recipe_config_and_runtime_paths(case, runtime, trainer, want, make_job):
    job = make_job(name="test-job", runtime=runtime, command=["tune", "run"], **trainer)
    container = resolve(job, builtin_runtimes()[runtime]).trainer().container("node")
    assert container.command == ["tune", "run", *want]
    assert container.args == trainer.get("args", [])


def test_a_job_without_the_tune_run_command_runs_the_runtime_command_unchanged(make_job):
    runtime = builtin_runtimes()["torchtune-llama3.2-1b"]
    container = resolve(make_job(name="test-job", runtime=runtime.name), runtime).trainer().container("node")
    assert container.command[:6] == ["tune", "run", "--rdzv_endpoint=localhost:29500", "full_finetune_distributed",
                                     "--config", "llama3_2/1B_full"]


# (case, runtime, trainer fields besides command, the errors: "path: message")
ERRORS = [
    ("unsupported pretrained model", "torchtune-llama3.1-70b", {"numNodes": 1},
     ['spec.runtimeRef.name: Invalid value: "torchtune-llama3.1-70b": must have a supported pretrained model, '
      "invalid model configured: llama3_1/70B"]),
    ("multi-node only for Llama 3.3 70B", "torchtune-llama3.2-3b", {"numNodes": 2},
     ["spec.trainer.numNodes: Invalid value: 2: must be 1 for llama3_2/3B model"]),
    ("QLoRA is not supported for qwen", "torchtune-qwen2.5-1.5b", {"numNodes": 1, "args": QLORA},
     ['spec.runtimeRef.name: Invalid value: "torchtune-qwen2.5-1.5b": QLoRA is not supported for qwen2_5/1.5B model']),
    ("multi-device QLoRA is not supported for llama3.2-1b", "torchtune-llama3.2-1b",
     {"numNodes": 1, "args": QLORA, "resourcesPerNode": {"requests": {"example.com/gpu": "2"}}},
     ['spec.trainer.numProcPerNode: Invalid value: "auto": must be auto or 1 for llama3_2/1B model when using QLoRA',
      'spec.trainer.resourcesPerNode: Invalid value: {"requests":{"example.com/gpu":"2"}}: must have gpu resource '
      "with value 1 for llama3_2/1B model when using QLoRA"]),
    ("LoRA is not supported on several nodes", "torchtune-llama3.3-70b", {"numNodes": 2, "args": LORA},
     ["spec.trainer.numNodes: Invalid value: 2: LoRA fine-tuning is not supported for multi-node training in "
      "TorchTune"]),
    ("immutable runtime configs", "torchtune-llama3.2-1b",
     {"numNodes": 1, "args": ["output_dir=custom-output", "tokenizer.path=/some/path"]},
     ['spec.trainer.args[0]: Invalid value: "output_dir=custom-output": must not set immutable config "output_dir" '
      "in trainer args; it is managed by the runtime",
      'spec.trainer.args[1]: Invalid value: "tokenizer.path=/some/path": must not set immutable config '
      '"tokenizer.path" in trainer args; it is managed by the runtime']),
]


@pytest.mark.parametrize(("case", "runtime", "trainer", "want"), ERRORS, ids=[c[0] for c in ERRORS])
def test_torchtune_jobs_are_refused_as_kubeflow_refuses_them(case, runtime, trainer, want, make_job, make_runtime):
    job = make_job(name="test", runtime=runtime, command=["tune", "run"], **trainer)
    rt = make_runtime(name=runtime, mlPolicy={"numNodes": 1, "torch": {}})
    with pytest.raises(ValidationError) as err:
        resolve(job, rt)
    assert [f"{e.path}: {e.message}" for e in err.value.errors] == want


def test_lora_on_one_node_of_the_70b_model_is_accepted(make_job, make_runtime):
    job = make_job(name="test", runtime="torchtune-llama3.3-70b", command=["tune", "run"], numNodes=1, args=LORA)
    plan = resolve(job, make_runtime(name="torchtune-llama3.3-70b", mlPolicy={"numNodes": 1, "torch": {}}))
    assert plan.trainer().container("node").command[2:5] == ["lora_finetune_single_device", "--config",
                                                             "llama3_3/70B_lora_single_device"]


def test_multi_node_70b_gets_the_multinode_config_and_the_rendezvous(make_job, make_runtime):
    command = ["tune", "run", "full_finetune_distributed", "--config", "llama3_3/70B_full_multinode",
               "output_dir=/workspace/model/llama3_3/70B", "tokenizer.path=/workspace/model/original/tokenizer.model",
               "checkpointer.checkpoint_dir=/workspace/model"]
    rt = make_runtime(name="torchtune-llama3.3-70b", mlPolicy={"numNodes": 100, "torch": {}},
                      container={"command": command})
    job = make_job(name="test-job", runtime=rt.name, command=["tune", "run"], numNodes=30, numProcPerNode=3,
                   args=["dtype=fp16"])
    container = resolve(job, rt).trainer().container("node")
    assert container.command == ["tune", "run", RDZV, "full_finetune_distributed", "--config",
                                 "llama3_3/70B_full_multinode", *command[5:]]
