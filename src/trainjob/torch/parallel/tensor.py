"""Tensor parallelism: Megatron's column- and row-parallel linear layers through ``torch.distributed.tensor.parallel``.

In a transformer block, Q, K, V and the MLP's up projection are split by output features (column parallel: each
rank computes its heads or its slice of the hidden layer, no communication), and the attention output and the
MLP's down projection are split by input features (row parallel: partial sums all-reduced). One all-reduce per
sub-layer in forward and one in backward. With ``sequence_parallel=True`` the norms and residual stream are split
along the sequence instead of replicated, and each all-reduce becomes a reduce-scatter plus an all-gather.

A plan maps module paths (``*`` matches one name, as in :func:`parallelize_module`) to parallel styles::

    apply_tp(model, mesh["tp"], transformer_plan(sequence_parallel=True))
    apply_tp(mlp, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})   # any module

Before anything is sharded, every planned layer's split dimension and every ``n_heads`` attribute in the model is
checked against the TP degree, so a bad degree fails with a message naming the layer and the degrees that work.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from trainjob.errors import ValidationError

__all__ = ["TPPlan", "apply_tp", "check_tp_plan", "transformer_plan"]

TPPlan = Mapping[str, ParallelStyle]


def transformer_plan(sequence_parallel: bool = False, layers: str = "layers") -> dict[str, ParallelStyle]:
    """The plan for :class:`~trainjob.torch.parallel.gpt.GPT` and models named like it.

    ``{layers}.*.attn.{wq,wk,wv}`` and ``{layers}.*.ffn.up`` column parallel, ``attn.wo`` and ``ffn.down`` row
    parallel, the output head column parallel with its logits gathered; embeddings and norms stay replicated.
    With ``sequence_parallel`` the norms run on sequence shards (``SequenceParallel``), the embedding's output is
    split along the sequence, and each block gathers the sequence before attention and the MLP.
    """
    seq = Shard(1)
    block: dict[str, ParallelStyle] = {
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(output_layouts=seq) if sequence_parallel else RowwiseParallel(),
        "ffn.up": ColwiseParallel(),
        "ffn.down": RowwiseParallel(output_layouts=seq) if sequence_parallel else RowwiseParallel(),
    }
    root: dict[str, ParallelStyle] = {"head": ColwiseParallel(output_layouts=Replicate())}
    if sequence_parallel:
        block |= {
            "attn_norm": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "ffn_norm": SequenceParallel(),
            "ffn": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        }
        root = {
            "embed": PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(seq,)),
            "norm": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
        }
    return {f"{layers}.*.{path}": style for path, style in block.items()} | root


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, plan: TPPlan) -> nn.Module:
    """Shard ``model`` in place over the 1-D ``tp_mesh`` following ``plan``; returns ``model``.

    Plan entries whose first path element is a top-level piece set to ``None`` (removed from this pipeline
    stage) are skipped; any other entry that matches no module is an error.
    """
    present = check_tp_plan(model, plan, tp_mesh.size())
    if tp_mesh.size() > 1:
        parallelize_module(model, tp_mesh, present)
    return model


def check_tp_plan(model: nn.Module, plan: TPPlan, tp: int) -> dict[str, ParallelStyle]:
    """The plan entries that apply to ``model``; raises :class:`ValidationError` for an entry matching nothing,
    or when ``tp`` does not divide a dimension the plan splits or an ``n_heads`` attribute::

        check_tp_plan(GPT(GPTConfig(n_heads=4)), transformer_plan(), tp=3)
        # parallel.tp: 3 does not divide layers.0.attn.n_heads=4 (the attention head count); tp must be one of [1, 2, 4]
    """
    plan = _present_entries(model, plan)
    problems: list[ValidationError] = []
    for path, module in model.named_modules():
        n_heads = getattr(module, "n_heads", None)
        if isinstance(n_heads, int) and n_heads % tp:
            problems.append(_indivisible(f"{path}.n_heads", n_heads, tp, "the attention head count"))
    for key, style in plan.items():
        for path, module in _match(model, key):
            split = _split_size(module, style)
            if split is not None and split[1] % tp:
                problems.append(
                    _indivisible(f"{path}.{split[0]}", split[1], tp, f"what {type(style).__name__} splits")
                )
    if problems:
        raise ValidationError.combine(problems)
    return plan


def _indivisible(path: str, size: int, tp: int, what: str) -> ValidationError:
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    return ValidationError(
        "parallel.tp", f"{tp} does not divide {path}={size} ({what}); tp must be one of {divisors}"
    )


def _split_size(module: nn.Module, style: ParallelStyle) -> tuple[str, int] | None:
    colwise = isinstance(style, ColwiseParallel)
    if not (colwise or isinstance(style, RowwiseParallel)):
        return None
    if isinstance(module, nn.Linear):
        return ("out_features", module.out_features) if colwise else ("in_features", module.in_features)
    if isinstance(module, nn.Embedding):
        return (
            ("embedding_dim", module.embedding_dim) if colwise else ("num_embeddings", module.num_embeddings)
        )
    return None


def _present_entries(model: nn.Module, plan: TPPlan) -> dict[str, ParallelStyle]:
    present: dict[str, ParallelStyle] = {}
    for key, style in plan.items():
        if next(_match(model, key), None) is not None:
            present[key] = style
        elif getattr(model, key.split(".")[0], "missing") is None:
            continue  # a piece this pipeline stage does not hold
        else:
            raise ValidationError(f"tp_plan[{key!r}]", f"matches no module of {type(model).__name__}")
    return present


def _match(module: nn.Module, key: str, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """Modules under ``module`` whose dotted path matches ``key`` atom by atom (``*`` within one atom)."""
    head, _, rest = key.partition(".")
    for name, child in module.named_children():
        if child is None or not fnmatch.fnmatchcase(name, head):
            continue
        path = f"{prefix}{name}"
        if rest:
            yield from _match(child, rest, f"{path}.")
        else:
            yield path, child
