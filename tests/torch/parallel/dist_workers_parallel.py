"""Training runs under several parallel layouts, executed inside run_distributed's processes (and a reference).

All runs train the same tiny GPT from the same seed on the same batches, so a layout that splits the math
correctly reproduces the single-process losses and parameters up to float rounding.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from trainjob.errors import ValidationError
from trainjob.torch import Checkpointer, GradientAccumulation, clip_grad_norm_, prepare_model
from trainjob.torch.parallel import ParallelDims, PipelineConfig, parallelize
from trainjob.torch.parallel.gpt import GPT, GPTConfig, lm_loss

CONFIG = GPTConfig(vocab_size=32, max_seq_len=8, dim=16, n_heads=4, n_layers=4)
BATCH = 8
SEQ = 8
MAX_GRAD_NORM = 0.8  # below the first step's gradient norm (about 1.1): clipping changes the result


def make_optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    """SGD shows a wrongly scaled gradient (Adam would hide it); AdamW gives a checkpoint real optimizer state."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.5, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, CONFIG.vocab_size, (steps, BATCH, SEQ + 1), generator=generator)
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def fresh_model(**sizes: int) -> GPT:
    torch.manual_seed(0)
    return GPT(dataclasses.replace(CONFIG, **sizes))


def reference_run(steps: int, optimizer: str = "sgd") -> dict[str, Any]:
    """One process, no parallelism: what every layout must reproduce (losses, gradient norms before clipping,
    final parameters, and the loss on a held-out batch)."""
    model = fresh_model()
    opt = make_optimizer(optimizer, model.parameters())
    losses, norms = [], []
    data = batches(steps + 1)
    for inputs, targets in data[:steps]:
        loss = lm_loss(model(inputs), targets)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM).item())
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    with torch.no_grad():
        held_out = lm_loss(model(data[-1][0]), data[-1][1]).item()
    return {
        "losses": losses,
        "grad_norms": norms,
        "held_out_loss": held_out,
        "params": {k: v.detach().clone() for k, v in model.named_parameters()},
    }


def _build(layout: dict[str, Any]) -> Any:
    """``parallelize`` with the layout's settings, or ``prepare_model(parallel=...)`` when ``via`` says so."""
    dims = ParallelDims(**layout["dims"])
    model = fresh_model(**layout.get("model", {}))
    options = {k: v for k, v in layout.items() if k not in ("dims", "pipeline", "via", "model", "clip_with")}
    if "pipeline" in layout:
        options["pipeline"] = PipelineConfig(**layout["pipeline"])
    if layout.get("via") == "prepare_model":
        return prepare_model(model, parallel=dims, **options)
    return parallelize(model, dims, **options)


def _rows(model: Any) -> slice:
    share = BATCH // model.dp_size
    return slice(model.dp_rank * share, (model.dp_rank + 1) * share)


def _train(
    model: Any,
    opt: torch.optim.Optimizer,
    steps: list[tuple[torch.Tensor, torch.Tensor]],
    norms: list | None = None,
    clip_with: str = "method",
) -> list[float]:
    """Train on each rank's share of ``steps``; with ``norms``, clip gradients and record their norms, through
    ``model.clip_grad_norm_`` or (``clip_with="trainjob.torch"``) the library function."""
    losses = []
    for inputs, targets in steps:
        losses.append(model.train_step(inputs[_rows(model)], targets[_rows(model)]).item())
        if norms is not None:
            if clip_with == "method":
                norm = model.clip_grad_norm_(MAX_GRAD_NORM)
            else:
                norm = clip_grad_norm_(model, MAX_GRAD_NORM)
            norms.append(norm.item())
        opt.step()
        opt.zero_grad()
    return losses


def train_layout(layout: dict[str, Any], steps: int) -> dict[str, Any]:
    """Losses, gradient norms, held-out loss and this rank's gathered (full) parameters after ``steps`` SGD steps
    with gradient clipping; also what was built: the pipeline settings, the checkpointed blocks, and whether the
    norms' weights are tensor-parallel DTensors (sequence parallelism, without FSDP)."""
    model = _build(layout)
    built = {
        "pipeline": model.pipeline.config if model.pipeline is not None else None,
        "checkpointed": sorted(
            name for name, module in model.named_modules() if isinstance(module, CheckpointWrapper)
        ),
        "sequence_sharded_norms": all(
            isinstance(param, DTensor) for name, param in model.named_parameters() if "norm" in name
        ),
    }
    data = batches(steps + 1)
    norms: list[float] = []
    optimizer = make_optimizer("sgd", model.parameters())
    losses = _train(model, optimizer, data[:steps], norms, layout.get("clip_with", "method"))
    held_out = model.evaluate(data[-1][0][_rows(model)], data[-1][1][_rows(model)]).item()
    params = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {
        "losses": losses,
        "grad_norms": norms,
        "held_out_loss": held_out,
        "params": {name: tensor.clone() for name, tensor in params.items()},
        **built,
    }


def resume_across_layouts(
    save: dict[str, Any], load: dict[str, Any], steps: int, directory: str
) -> dict[str, Any]:
    """Train under ``save`` and checkpoint half-way; load under ``load`` (with and without the optimizer state)
    and train the second half again."""
    data = batches(steps)
    half = steps // 2
    model = _build(save)
    opt = make_optimizer("adamw", model.parameters())
    before_save = _train(model, opt, data[:half])
    checkpointer = Checkpointer(directory)
    checkpointer.save(half, model, opt)
    uninterrupted = _train(model, opt, data[half:])

    resumed_model = _build(load)
    resumed_opt = make_optimizer("adamw", resumed_model.parameters())
    step = checkpointer.load(resumed_model, resumed_opt)
    resumed = _train(resumed_model, resumed_opt, data[half:])

    model_only = _build(load)
    checkpointer.load(model_only)  # a fresh optimizer: what resuming without optimizer state would give
    without_optimizer_state = _train(
        model_only, make_optimizer("adamw", model_only.parameters()), data[half:]
    )
    return {
        "step": step,
        "before_save": before_save,
        "uninterrupted": uninterrupted,
        "resumed": resumed,
        "without_optimizer_state": without_optimizer_state,
    }


def refusals(layouts: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The error message ``parallelize`` (or the first ``train_step``) gives for each layout."""
    messages = {}
    for name, layout in layouts.items():
        try:
            model = _build(layout)
            inputs, targets = batches(1)[0]
            model.train_step(inputs, targets)
        except ValidationError as err:
            messages[name] = str(err)
        else:
            messages[name] = "accepted"
    return messages


def mesh_groups(dims: dict[str, int]) -> dict[str, list[int]]:
    """The ranks of this rank's TP, PP and DP groups as the real DeviceMesh sees them."""
    parallel = ParallelDims(**dims)
    mesh = parallel.build_mesh("cpu")
    return {
        "tp": mesh["tp"].mesh.flatten().tolist(),
        "pp": mesh["pp"].mesh.flatten().tolist(),
        "dp": parallel.dp_mesh(mesh).mesh.flatten().tolist(),
    }


def _grads_equal_across_ranks(model: Any) -> bool:
    grad = next(p.grad for p in model.parameters() if p.grad is not None).detach().clone()
    gathered = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, grad)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])


def accumulation(layouts: dict[str, dict[str, Any]]) -> dict[str, dict[str, bool]]:
    """Per layout, two micro-steps of ``GradientAccumulation(model, 2)``: whether the first left the gradients
    unreduced (DDP: they differ across ranks; FSDP: nothing reduce-scattered yet) and the second reduced them."""
    ((inputs, targets),) = batches(1)
    found = {}
    for name, layout in layouts.items():
        model = _build(layout)
        ddp = layout.get("zero_stage") == 0
        accumulate = GradientAccumulation(model, micro_steps=2)
        with accumulate.micro_step(0):
            model.train_step(inputs[_rows(model)], targets[_rows(model)])
        first = (
            not _grads_equal_across_ranks(model) if ddp else all(p.grad is None for p in model.parameters())
        )
        with accumulate.micro_step(1):
            model.train_step(inputs[_rows(model)], targets[_rows(model)])
        last = (
            _grads_equal_across_ranks(model) if ddp else all(p.grad is not None for p in model.parameters())
        )
        found[name] = {"first_unreduced": first, "last_reduced": last}
    return found


def run_scenarios(scenarios: list[dict[str, Any]], tmp_dir: str) -> dict[str, Any]:
    """Run each scenario (``{"name", "kind", ...}``) in turn in one process group; results by name."""
    results: dict[str, Any] = {}
    for scenario in scenarios:
        name, kind = scenario["name"], scenario["kind"]
        if kind == "train":
            results[name] = train_layout(scenario["layout"], scenario["steps"])
        elif kind == "resume":
            directory = str(Path(tmp_dir) / name)
            results[name] = resume_across_layouts(
                scenario["save"], scenario["load"], scenario["steps"], directory
            )
        elif kind == "mesh":
            results[name] = mesh_groups(scenario["dims"])
        elif kind == "refusals":
            results[name] = refusals(scenario["layouts"])
        elif kind == "accumulation":
            results[name] = accumulation(scenario["layouts"])
        elif kind == "schedule_rules":
            results[name] = schedule_acceptance(scenario["max_microbatches"])
        else:
            raise ValueError(f"unknown scenario kind {kind!r}")
        dist.barrier()
    return results


def schedule_acceptance(max_microbatches: int) -> dict[str, list[int]]:
    """For each schedule at pp=2: the micro-batch counts PyTorch's own schedule constructor accepts."""
    from torch import nn
    from torch.distributed.pipelining import PipelineStage

    from trainjob.torch.parallel import SCHEDULES, PipelineConfig

    dims = ParallelDims(dp_shard=-1, pp=2)
    mesh = dims.build_mesh("cpu")
    pp_rank, pp = mesh["pp"].get_local_rank(), mesh["pp"].size()
    accepted: dict[str, list[int]] = {}
    for name, rule in SCHEDULES.items():
        spr = PipelineConfig(schedule=name).resolved_stages_per_rank()
        num_stages = pp * spr
        indices = (
            [pp_rank, 2 * pp - 1 - pp_rank] if rule.style == "v" else [pp_rank + i * pp for i in range(spr)]
        )
        stages = [
            PipelineStage(
                nn.Linear(2, 2), index, num_stages, torch.device("cpu"), group=mesh["pp"].get_group()
            )
            for index in indices
        ]
        accepted[name] = []
        for microbatches in range(1, max_microbatches + 1):
            try:
                rule.cls(stages[0] if rule.single_stage else stages, microbatches, loss_fn=lm_loss)
            except ValueError:
                continue
            accepted[name].append(microbatches)
    return accepted
