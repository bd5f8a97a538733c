"""Runs inside run_distributed: data-parallel training compared with one process on the same global batches."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from dist_workers_common import Indexed, Net, full_params, gather_indices, loader, max_diff

import trainjob.torch as tt

LR = 0.2
MOMENTUM = 0.9


def _grads_differ_across_ranks(model: torch.nn.Module) -> bool:
    grad = model.module.head.weight.grad.detach().clone()
    gathered = [torch.empty_like(grad) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, grad)
    return any(not torch.equal(gathered[0], g) for g in gathered[1:])


def _train_and_compare(
    strategy: str, micro_steps: int, clip: float | None, steps: int, global_batch: int
) -> dict[str, Any] | None:
    ctx = tt.init()
    dataset = Indexed(64)
    tt.seed_everything(0)
    model = tt.prepare_model(Net(), strategy)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    data = tt.prepare_data_loader(loader(dataset, global_batch // ctx.world_size), seed=1)
    accumulation = tt.GradientAccumulation(model, micro_steps)
    step_indices: list[list[int]] = []
    norms: list[float] = []
    current: list[int] = []
    unsynced: list[bool] = []
    for i, (idx, x, y) in enumerate(data):
        current += gather_indices(idx)
        with accumulation.micro_step(i) as last:
            (F.cross_entropy(model(x), y) / micro_steps).backward()
        if not last and i == 0:
            if strategy == "ddp":
                unsynced.append(_grads_differ_across_ranks(model))
            else:  # FSDP: nothing reduce-scattered into the sharded gradients yet
                unsynced.append(all(p.grad is None for p in model.parameters()))
        if last:
            if clip is not None:
                norms.append(tt.clip_grad_norm_(model, clip).item())
            optimizer.step()
            optimizer.zero_grad()
            step_indices.append(current)
            current = []
            if len(step_indices) == steps:
                break
    got = full_params(model)
    if not ctx.is_main:
        return None

    torch.manual_seed(0)
    reference = Net()
    initial = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    ref_norms = []
    for indices in step_indices:
        F.cross_entropy(reference(dataset.x[indices]), dataset.y[indices]).backward()
        if clip is not None:
            ref_norms.append(torch.nn.utils.clip_grad_norm_(reference.parameters(), clip).item())
        ref_optimizer.step()
        ref_optimizer.zero_grad()
    return {
        "param_diff": max_diff(got, {k: v.detach() for k, v in reference.state_dict().items()}),
        "param_change": max_diff(got, initial),
        "norms": norms,
        "ref_norms": ref_norms,
        "steps": len(step_indices),
        "samples_per_step": sorted({len(s) for s in step_indices}),
        "distinct_per_step": all(len(set(s)) == len(s) for s in step_indices),
        "unsynced_micro_step": unsynced,
    }


def _loader_epochs() -> dict[str, Any]:
    data = tt.prepare_data_loader(loader(Indexed(20), 2, shuffle=True), seed=3)
    epochs = []
    for _ in range(2):
        seen: list[int] = []
        for idx, x, _y in data:  # noqa: B007 - the last batch tells the device
            seen += gather_indices(idx)
        epochs.append(seen)
    return {
        "epoch_sizes": [len(e) for e in epochs],
        "disjoint": all(len(set(e)) == len(e) for e in epochs),
        "same_samples": set(epochs[0]) == set(epochs[1]),
        "orders_differ": epochs[0] != epochs[1],
        "epoch_after": data.epoch,
        "device": str(x.device),
        "sampler": type(data.sampler).__name__,
    }


def run_all(steps: int = 4, global_batch: int = 8) -> dict[str, Any]:
    """Every scenario in one launch: {scenario: result}; training results are None on ranks other than 0."""
    results: dict[str, Any] = {}
    for strategy in ("ddp", "fsdp"):
        for micro_steps in (1, 2):
            results[f"{strategy}/micro{micro_steps}"] = _train_and_compare(strategy, micro_steps, None, steps, global_batch)
        results[f"{strategy}/clip"] = _train_and_compare(strategy, 1, 0.05, steps, global_batch)
    results["loader"] = _loader_epochs()
    return results
