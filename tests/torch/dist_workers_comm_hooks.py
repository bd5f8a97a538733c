"""Runs inside run_distributed: the same small problem trained with every communication hook and without one."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import trainjob.torch as tt

FEATURES, HIDDEN, CLASSES = 32, 64, 8
WIDTH = 128


class Teacher:
    """A fixed random network that labels fresh Gaussian inputs: a learnable problem with unlimited data, so the
    held-out loss measures what was learned rather than what was memorised."""

    def __init__(self, seed: int = 11) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.w1 = torch.randn(FEATURES, HIDDEN, generator=gen) / FEATURES**0.5
        self.w2 = torch.randn(HIDDEN, CLASSES, generator=gen)

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, FEATURES, generator=gen)
        return x, (torch.tanh(x @ self.w1) @ self.w2).argmax(dim=1)


def student() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(),
                         nn.Linear(WIDTH, CLASSES))  # fmt: skip


def train(
    hook: str | None, options: dict[str, Any] | None, steps: int, local_batch: int, lr: float, momentum: float
) -> dict[str, Any]:
    ctx = tt.init()
    teacher = Teacher()
    test_x, test_y = teacher.sample(4096, torch.Generator().manual_seed(2))
    model = tt.prepare_model(student(), "ddp", comm_hook=hook, comm_hook_options=options)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    gen = torch.Generator().manual_seed(1)  # the same global batches on every rank and in every run
    with torch.no_grad():
        initial = F.cross_entropy(model.module(test_x), test_y).item()
    for _ in range(steps):
        x, y = teacher.sample(local_batch * ctx.world_size, gen)
        mine = slice(ctx.rank * local_batch, (ctx.rank + 1) * local_batch)
        F.cross_entropy(model(x[mine]), y[mine]).backward()
        optimizer.step()
        optimizer.zero_grad()
    net = model.module
    with torch.no_grad():
        logits = net(test_x)
        loss = F.cross_entropy(logits, test_y).item()
        accuracy = (logits.argmax(1) == test_y).float().mean().item()
    replicas_agree = _same_on_every_rank(net)
    return {"initial_loss": initial, "test_loss": loss, "test_accuracy": accuracy, "replicas_agree": replicas_agree}


def _same_on_every_rank(net: nn.Module) -> bool:
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])


# Defaults (PowerSGD from step 10, top-k 1 % with error feedback) but PowerSGD at rank 2 (rank 1 ends +6.6 %), plus
# top-k at 0.1 % with and without error feedback: the case where carrying the residual decides whether it learns.
HOOKS: dict[str, tuple[str | None, dict[str, Any] | None]] = {
    "none": (None, None),
    "fp16": ("fp16", None),
    "bf16": ("bf16", None),
    "powersgd": ("powersgd", {"rank": 2}),
    "topk": ("topk", None),
    "topk_0.1%": ("topk", {"ratio": 0.001}),
    "topk_0.1%_without_error_feedback": ("topk", {"ratio": 0.001, "error_feedback": False}),
}


def run_all(steps: int = 600, local_batch: int = 32, lr: float = 0.03, momentum: float = 0.9) -> dict[str, Any]:
    return {name: train(hook, options, steps, local_batch, lr, momentum) for name, (hook, options) in HOOKS.items()}
