"""The loss ``parallelize`` trains with unless given another: what the last pipeline stage and ``train_step`` compute.

A loss is any ``loss_fn(outputs, targets) -> scalar tensor``. The default suits a language model whose outputs are
logits ``(batch, seq, vocab)`` and whose targets are token ids ``(batch, seq)``::

    loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["LossFn", "lm_loss"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position, computed in float32: ``lm_loss(model(x), y)``."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
