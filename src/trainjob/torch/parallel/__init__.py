"""Tensor, pipeline and 3-D parallelism for plain PyTorch models, on one named device mesh.

::

    from trainjob.torch.parallel import ParallelDims, PipelineConfig, parallelize

    dims = ParallelDims(dp_shard=-1, tp=2, pp=2)
    print(dims.layout())                       # which ranks form the TP, PP and DP groups
    model = parallelize(model, dims, pipeline=PipelineConfig("1F1B", microbatches=4))
    loss = model.train_step(tokens, targets)

``trainjob.torch.prepare_model(model, parallel=dims, pipeline=...)`` does the same. FSDP, DDP and activation
checkpointing are :mod:`trainjob.torch.wrap`'s, shared with ``prepare_model`` and re-exported here. The default
loss (``lm_loss``, next-token cross-entropy) is :mod:`trainjob.torch.parallel.loss`'s.

Names load on first use, so :class:`ParallelDims` (the one definition of the rank layout, which the planner in
:mod:`trainjob.tools` uses too) can be imported without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "MESH_DIM_NAMES": "trainjob.torch.parallel.dims",
    "ParallelDims": "trainjob.torch.parallel.dims",
    "ParallelModel": "trainjob.torch.parallel.compose",
    "parallelize": "trainjob.torch.parallel.compose",
    "SCHEDULES": "trainjob.torch.parallel.pipeline",
    "PipelineConfig": "trainjob.torch.parallel.pipeline",
    "check_microbatches": "trainjob.torch.parallel.pipeline",
    "split_layers": "trainjob.torch.parallel.stages",
    "apply_tp": "trainjob.torch.parallel.tensor",
    "check_tp_plan": "trainjob.torch.parallel.tensor",
    "transformer_plan": "trainjob.torch.parallel.tensor",
    "LossFn": "trainjob.torch.parallel.loss",
    "lm_loss": "trainjob.torch.parallel.loss",
    "apply_activation_checkpointing": "trainjob.torch.wrap",
    "apply_ddp": "trainjob.torch.wrap",
    "apply_fsdp": "trainjob.torch.wrap",
}

__all__ = [
    "MESH_DIM_NAMES",
    "LossFn",
    "SCHEDULES",
    "ParallelDims",
    "ParallelModel",
    "PipelineConfig",
    "apply_activation_checkpointing",
    "apply_ddp",
    "apply_fsdp",
    "apply_tp",
    "check_microbatches",
    "check_tp_plan",
    "lm_loss",
    "parallelize",
    "split_layers",
    "transformer_plan",
]

if TYPE_CHECKING:
    from trainjob.torch.parallel.compose import ParallelModel, parallelize
    from trainjob.torch.parallel.dims import MESH_DIM_NAMES, ParallelDims
    from trainjob.torch.parallel.loss import LossFn, lm_loss
    from trainjob.torch.parallel.pipeline import SCHEDULES, PipelineConfig, check_microbatches
    from trainjob.torch.parallel.stages import split_layers
    from trainjob.torch.parallel.tensor import apply_tp, check_tp_plan, transformer_plan
    from trainjob.torch.wrap import apply_activation_checkpointing, apply_ddp, apply_fsdp


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainjob.torch.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
