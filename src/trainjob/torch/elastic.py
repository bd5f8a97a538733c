"""Training through node losses and returns: learning-rate scaling, resize reports and grows at checkpoints.

An elastic job (``elasticPolicy {minNodes, maxNodes}``) goes on with fewer nodes when one is lost and grows
back when it returns; every change of size restarts the ranks, which resume from the newest checkpoint. Give
the :class:`~trainjob.torch.Checkpointer` an :class:`ElasticConfig` and it also:

- **scales the learning rate** on resume by the change of world size: ``"linear"`` multiplies it by
  ``new / old``, ``"sqrt"`` by ``sqrt(new / old)``, ``None`` keeps it (the optimizer's groups, ``initial_lr``
  and an LR scheduler's ``base_lrs``), so a fixed per-rank batch keeps its learning rate per sample;
- **reports every round**: rank 0 prints ``[trainjob] resized 3 -> 2 nodes (world size 3 -> 2), resuming
  at step 40`` when the number of nodes differs from the checkpoint's, and appends the round (nodes, world size,
  step) to ``$TRAINJOB_JOB_DIR/elastic.jsonl`` for the local supervisor's ``Resized`` events;
- **grows at a checkpoint**: when the local supervisor has a node ready to come back, the ranks finish the
  checkpoint they are saving, say so, and wait (at most ``grow_wait_seconds``) to be restarted at the larger
  size, so a grow repeats no steps.

The data loader (:func:`~trainjob.torch.prepare_data_loader`) is sharded by the new world size at every start
and continues its epoch after the samples already consumed, at any world size::

    ckpt = tt.Checkpointer("checkpoints", elastic=tt.ElasticConfig(lr_scaling="linear"))
    step = ckpt.resume(model, optimizer, loader=loader)
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.optim import Optimizer

from trainjob.constants import JOB_DIR_ENV, PET_NODE_RANK
from trainjob.errors import ValidationError
from trainjob.torch import env

__all__ = ["LR_SCALINGS", "ElasticConfig", "lr_factor", "scale_learning_rate"]

#: The accepted ``lr_scaling`` values besides ``None``.
LR_SCALINGS = ("linear", "sqrt")
_ROUNDS_FILE = "elastic.jsonl"
_GROW_REQUEST = os.path.join("elastic", "grow-request")
_GROW_READY = os.path.join("elastic", "grow-ready")
_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class ElasticConfig:
    """How a training script follows changes of world size (see the module docstring).

    ``lr_scaling``: ``"linear"``, ``"sqrt"`` or ``None`` (keep the learning rate). ``grow_wait_seconds``: how
    long ranks that checkpointed for a returning node wait to be restarted before they train on.
    """

    lr_scaling: str | None = None
    grow_wait_seconds: float = 120.0

    def __post_init__(self) -> None:
        if self.lr_scaling is not None and self.lr_scaling not in LR_SCALINGS:
            raise ValidationError(
                "lr_scaling", f"must be one of {', '.join(map(repr, LR_SCALINGS))} or None, got {self.lr_scaling!r}"
            )
        wait = self.grow_wait_seconds
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < math.inf:
            raise ValidationError("grow_wait_seconds", f"must be a number of seconds >= 0, got {wait!r}")

    def lr_factor(self, new_world_size: int, old_world_size: int) -> float:
        """What the learning rate is multiplied by when the world size goes from ``old`` to ``new``."""
        return lr_factor(self.lr_scaling, new_world_size, old_world_size)


def lr_factor(scaling: str | None, new_world_size: int, old_world_size: int) -> float:
    """``new/old`` (``"linear"``), ``sqrt(new/old)`` (``"sqrt"``) or 1 (``None``)::

    >>> lr_factor("linear", 2, 3), lr_factor("sqrt", 4, 1), lr_factor(None, 2, 3)
    (0.6666666666666666, 2.0, 1.0)
    """
    for name, size in (("new_world_size", new_world_size), ("old_world_size", old_world_size)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValidationError(name, f"must be an integer >= 1, got {size!r}")
    if scaling is None:
        return 1.0
    if scaling == "linear":
        return new_world_size / old_world_size
    if scaling == "sqrt":
        return math.sqrt(new_world_size / old_world_size)
    raise ValidationError("lr_scaling", f"must be one of {', '.join(map(repr, LR_SCALINGS))} or None, got {scaling!r}")


def scale_learning_rate(optimizer: Optimizer | None, factor: float, *others: Any) -> None:
    """Multiply the learning rate of ``optimizer``'s groups (and their ``initial_lr``) and of LR schedulers
    among ``others`` (``base_lrs``, ``_last_lr``) by ``factor``."""
    if factor == 1.0:
        return
    if optimizer is not None:
        for group in optimizer.param_groups:
            group["lr"] = _scaled(group["lr"], factor)
            if "initial_lr" in group:
                group["initial_lr"] = _scaled(group["initial_lr"], factor)
    for obj in others:
        for attribute in ("base_lrs", "_last_lr"):
            values = getattr(obj, attribute, None)
            if isinstance(values, list) and all(isinstance(v, int | float) for v in values):
                setattr(obj, attribute, [v * factor for v in values])


def _scaled(value: Any, factor: float) -> Any:
    if hasattr(value, "mul_"):  # a tensor learning rate (capturable optimizers)
        return value.mul_(factor)
    return value * factor


# rounds


def current_nodes() -> int:
    """Nodes in this round: torchrun's ``GROUP_WORLD_SIZE``, else world size over processes per node."""
    ctx = env.init()
    group = os.environ.get("GROUP_WORLD_SIZE")
    if group and group.isdigit():
        return int(group)
    return max(1, ctx.world_size // max(1, ctx.local_world_size))


def record_round(step: int, saved: dict[str, Any] | None) -> dict[str, Any]:
    """Report the round that resumed at ``step`` from a checkpoint whose ``trainjob.json`` is ``saved``
    (``None``: a fresh start): rank 0 prints a resize line and appends to ``elastic.jsonl``. Collective."""
    ctx = env.init()
    node = os.environ.get(PET_NODE_RANK) or os.environ.get("GROUP_RANK") or "0"
    node_ranks: list[Any] = [None] * ctx.world_size
    if ctx.world_size > 1:
        dist.all_gather_object(node_ranks, int(node) if node.isdigit() else node)
    else:
        node_ranks = [int(node) if node.isdigit() else node]
    nodes = current_nodes()
    record = {
        "time": time.time(),
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
        "nodes": nodes,
        "world_size": ctx.world_size,
        "node_ranks": sorted(set(node_ranks), key=str),
        "step": step,
        "previous_nodes": (saved or {}).get("nodes"),
        "previous_world_size": (saved or {}).get("world_size"),
        "gated": True,
    }
    if ctx.is_main:
        before = record["previous_nodes"]
        if isinstance(before, int) and before != nodes:
            print(
                f"[trainjob] resized {before} -> {nodes} nodes (world size {record['previous_world_size']} -> "
                f"{ctx.world_size}), resuming at step {step}",
                flush=True,
            )
        job_dir = os.environ.get(JOB_DIR_ENV)
        if job_dir and os.path.isdir(job_dir):
            with open(os.path.join(job_dir, _ROUNDS_FILE), "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
    return record


def grow_gate(step: int, config: ElasticConfig, before: Callable[[], None] | None = None) -> bool:
    """After the checkpoint of ``step``: if a node waits to come back, finish the save (``before``), tell the
    supervisor and wait to be restarted (at most ``config.grow_wait_seconds``). Collective; whether it waited."""
    ctx = env.init()
    job_dir = os.environ.get(JOB_DIR_ENV)
    if not job_dir:
        return False
    request = os.path.join(job_dir, _GROW_REQUEST)
    wanted = [os.path.exists(request)] if ctx.is_main else [False]
    if ctx.world_size > 1:
        dist.broadcast_object_list(wanted, src=0)
    if not wanted[0]:
        return False
    if before is not None:
        before()
    if ctx.world_size > 1:
        dist.barrier()
    if ctx.is_main:
        ready = os.path.join(job_dir, _GROW_READY)
        with open(ready + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"step": step, "time": time.time()}, f)
        os.replace(ready + ".tmp", ready)
        print(f"[trainjob] checkpoint of step {step} saved; waiting for returning node(s) to join", flush=True)
    deadline = time.monotonic() + config.grow_wait_seconds
    while os.path.exists(request) and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
    return True
