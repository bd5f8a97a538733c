"""Cut a model into pipeline stages by layer ranges, keeping the original parameter names.

A model is split along its ``layers`` :class:`~torch.nn.ModuleDict`. Its other top-level children go to the first
stage when registered before ``layers`` (embeddings) and to the last stage when registered after (final norm,
output head); the model's ``forward`` must skip children set to ``None``. A stage is a module of the model's class
sharing the kept children with the model, so every stage keeps the original names and checkpoints do not depend
on the split::

    split_layers(["0", "1", "2", "3", "4"], 2)            # [["0", "1", "2"], ["3", "4"]]
    stage_to_rank(4, 2, "v")                               # [0, 1, 1, 0]
    first = stage_view(model, ["0", "1", "2"], first=True, last=False)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from trainjob.errors import ValidationError

__all__ = ["build_stage_modules", "meta_copy", "split_layers", "stage_to_rank", "stage_view"]


def split_layers(
    layer_names: Sequence[str],
    num_stages: int,
    split_points: Sequence[str] | None = None,
    prefix: str = "layers.",
) -> list[list[str]]:
    """Layer names per stage: ``split_layers(["0", "1", "2"], 2) == [["0", "1"], ["2"]]``."""
    names = list(layer_names)
    if split_points is not None:
        starts = []
        for point in split_points:
            name = point.removeprefix(prefix)
            if name not in names:
                raise ValidationError(
                    f"pipeline.split_points[{point!r}]", f"is not a layer; layers are {names}"
                )
            starts.append(names.index(name))
        if len(starts) != num_stages - 1 or starts != sorted(set(starts)) or starts[0] == 0:
            raise ValidationError(
                "pipeline.split_points",
                f"need {num_stages - 1} increasing layer names after the first layer for {num_stages} stages, "
                f"got {list(split_points)}",
            )
        bounds = [0, *starts, len(names)]
    else:
        if len(names) < num_stages:
            raise ValidationError(
                "pipeline",
                f"{len(names)} layers cannot fill {num_stages} stages; lower pp or stages_per_rank",
            )
        base, extra = divmod(len(names), num_stages)
        bounds = [0]
        for stage in range(num_stages):
            bounds.append(bounds[-1] + base + (1 if stage < extra else 0))
    return [names[bounds[i] : bounds[i + 1]] for i in range(num_stages)]


def stage_to_rank(num_stages: int, pp: int, style: Literal["loop", "v"]) -> list[int]:
    """The pipeline rank of each stage: round-robin (``loop``) or there-and-back (``v``)."""
    if style == "loop":
        return [stage % pp for stage in range(num_stages)]
    return [stage if stage < pp else 2 * pp - 1 - stage for stage in range(num_stages)]


def stage_view(model: nn.Module, layer_names: Sequence[str], first: bool, last: bool) -> nn.Module:
    """A module of ``model``'s class sharing its children, keeping only ``layer_names`` and, if asked, the pieces
    registered before (``first``) or after (``last``) ``layers``; the rest are ``None``."""
    if any(True for _ in model.named_parameters(recurse=False)):
        raise ValidationError("model", "parameters directly on the root module cannot be placed on a stage")
    view = model.__class__.__new__(model.__class__)
    nn.Module.__init__(view)
    for key, value in vars(model).items():
        view.__dict__.setdefault(key, value)  # plain attributes such as a config
    for name, buffer in model.named_buffers(recurse=False):
        view.register_buffer(name, buffer)
    for name, keep in _piece_owner(model, first, last).items():
        setattr(view, name, getattr(model, name) if keep else None)
    layers = _layers(model)
    view.layers = nn.ModuleDict({name: layers[name] for name in layer_names})
    return view


def _layers(model: nn.Module) -> nn.ModuleDict:
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleDict):
        raise ValidationError(
            "model.layers", f"{type(model).__name__} needs its blocks in an nn.ModuleDict 'layers'"
        )
    return layers


def _piece_owner(model: nn.Module, first: bool, last: bool) -> dict[str, bool]:
    """Which top-level children a stage keeps: those before ``layers`` on the first, after it on the last."""
    _layers(model)
    names = [name for name, _ in model.named_children()]
    split = names.index("layers")
    return {name: first for name in names[:split]} | {name: last for name in names[split + 1 :]}


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` on the meta device (no storage copied), used to work out stage boundary shapes."""
    memo: dict[int, object] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        meta = torch.empty_like(tensor, device="meta")
        memo[id(tensor)] = (
            nn.Parameter(meta, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta
        )
    return copy.deepcopy(model, memo)


def build_stage_modules(
    model: nn.Module,
    *,
    pp: int,
    pp_rank: int,
    stages_per_rank: int,
    style: Literal["loop", "v"],
    split_points: Sequence[str] | None = None,
) -> tuple[list[nn.Module], list[int], list[list[str]]]:
    """This rank's stage modules, their stage indices, and the layer names of every stage::

    parts, indices, stage_layers = build_stage_modules(model, pp=2, pp_rank=0, stages_per_rank=2, style="loop")
    # indices == [0, 2]: stages 0 and 2 of 4
    """
    num_stages = pp * stages_per_rank
    stage_layers = split_layers(list(_layers(model).keys()), num_stages, split_points)
    placement = stage_to_rank(num_stages, pp, style)
    indices = [stage for stage in range(num_stages) if placement[stage] == pp_rank]
    parts = [stage_view(model, stage_layers[i], first=i == 0, last=i == num_stages - 1) for i in indices]
    return parts, indices, stage_layers
