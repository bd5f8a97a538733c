"""Train a small transformer with FSDP2, bf16 mixed precision and activation checkpointing.

Runs on CPU with gloo as well as on GPUs with NCCL::

    torchrun --nproc-per-node=2 examples/fsdp_bf16.py --steps 60
    torchrun --nproc-per-node=2 examples/fsdp_bf16.py --steps 60 --checkpoint-dir /tmp/fsdp-ckpt   # resumable

The data are generated: each sequence counts upward modulo the vocabulary with a stride of its own, so the next
token is predictable once the model has read a few tokens, and the loss falls within a few dozen steps.
Each transformer block is one FSDP unit (parameters gathered in bf16 just before it runs, gradients reduced in
float32) and one activation-checkpointing unit (its activations are recomputed in backward instead of stored).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainjob.torch as tt


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp_norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(batch, seq, 3, self.heads, dim // self.heads).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.mlp(self.mlp_norm(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, seq_len: int, dim: int = 64, depth: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch * seq, vocab): flat, so the output is not a view FSDP would warn about."""
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x).flatten(0, 1))


def counting_sequences(count: int, vocab: int, seq_len: int, seed: int = 0) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (count, 1), generator=gen)
    stride = torch.randint(1, 6, (count, 1), generator=gen)
    tokens = (start + stride * torch.arange(seq_len + 1)) % vocab
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16, help="per process")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint-dir", default=None, help="save every 20 steps and resume from here")
    args = parser.parse_args()

    vocab, seq_len = 32, 24
    ctx = tt.init()
    tt.seed_everything(0)
    model = tt.prepare_model(
        TinyLM(vocab, seq_len), "fsdp", mixed_precision="bf16", activation_checkpointing=True, wrap=Block
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = tt.prepare_data_loader(
        DataLoader(counting_sequences(4096, vocab, seq_len), batch_size=args.batch_size, shuffle=True, drop_last=True)
    )
    ckpt = tt.Checkpointer(args.checkpoint_dir, keep_last=2) if args.checkpoint_dir else None
    step = ckpt.resume(model, optimizer, loader=loader) if ckpt else 0
    tt.print0(f"{ctx.world_size} processes on {ctx.device.type}, starting at step {step}")

    while step < args.steps:
        for inputs, targets in loader:
            logits = model(inputs)  # float32: the root hands outputs back in full precision
            loss = F.cross_entropy(logits, targets.flatten())
            loss.backward()
            grad_norm = tt.clip_grad_norm_(model, 1.0)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step % 10 == 0 or step == args.steps:
                tt.report({"loss": loss, "grad_norm": grad_norm}, step=step, total_steps=args.steps)
            if ckpt and (step % 20 == 0 or step == args.steps):
                ckpt.save(step, model, optimizer, loader=loader)
            if step == args.steps:
                break
    tt.shutdown()


if __name__ == "__main__":
    main()
