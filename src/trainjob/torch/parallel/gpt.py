"""A small GPT-style language model in plain PyTorch, ready to be split, sharded and pipelined from the outside.

Nothing in here knows about parallelism. Two conventions make that possible:

- the transformer blocks live in ``layers``, an :class:`torch.nn.ModuleDict` keyed ``"0"``, ``"1"``, ... so a
  pipeline stage can keep a subset of them under their original names;
- ``forward`` skips every top-level piece set to ``None`` (``embed`` on later stages, ``norm`` and ``head`` on
  earlier ones), so a pruned copy of the model is a pipeline stage.

Attention reads its head count from the width of its input (``view(b, t, -1, head_dim)``), so the same code runs
with all heads or with the ``n_heads / tp`` heads a tensor-parallel rank holds::

    model = GPT(GPTConfig(vocab_size=256, dim=64, n_heads=4, n_layers=4))
    logits = model(torch.randint(0, 256, (8, 32)))      # (8, 32, 256)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainjob.torch.parallel.loss import lm_loss  # the loss this model trains with, parallelize's default too

__all__ = ["GPT", "GPTConfig", "lm_loss", "transformer_flops_per_token"]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of :class:`GPT`; ``ffn_dim`` defaults to ``4 * dim``."""

    vocab_size: int = 256
    max_seq_len: int = 128
    dim: int = 64
    n_heads: int = 4
    n_layers: int = 4
    ffn_dim: int | None = None

    @property
    def hidden_ffn_dim(self) -> int:
        return self.ffn_dim or 4 * self.dim


class Embedding(nn.Module):
    """Token plus learned position embedding."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens) + self.pos(positions)


class Attention(nn.Module):
    """Causal multi-head self-attention with separate Q, K, V projections."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.dim % cfg.n_heads:
            raise ValueError(f"dim={cfg.dim} must be a multiple of n_heads={cfg.n_heads}")
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.dim)
        self.wk = nn.Linear(cfg.dim, cfg.dim)
        self.wv = nn.Linear(cfg.dim, cfg.dim)
        self.wo = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: the full count, or the share a tensor-parallel rank holds.
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """``down(gelu(up(x)))``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.dim, cfg.hidden_ffn_dim)
        self.down = nn.Linear(cfg.hidden_ffn_dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))`` then ``x + ffn(norm(x))``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.dim)
        self.ffn = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class GPT(nn.Module):
    """Decoder-only transformer: ``embed -> layers -> norm -> head``; any of them may be ``None`` (a stage)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed: nn.Module | None = Embedding(cfg)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm: nn.Module | None = nn.LayerNorm(cfg.dim)
        self.head: nn.Module | None = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, tokens_or_hidden: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens_or_hidden) if self.embed is not None else tokens_or_hidden
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.head(h) if self.head is not None else h


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)


def transformer_flops_per_token(cfg: GPTConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), the usual ``6 N + 12 L d T`` estimate."""
    n_params = (
        cfg.n_layers * (4 * cfg.dim * cfg.dim + 2 * cfg.dim * cfg.hidden_ffn_dim) + cfg.dim * cfg.vocab_size
    )
    return 6.0 * n_params + 12.0 * cfg.n_layers * cfg.dim * seq_len
