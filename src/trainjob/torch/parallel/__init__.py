"""Tensor, pipeline and 3-D parallelism for plain PyTorch models, on one named device mesh.

::

    from trainjob.torch.parallel import ParallelDims, PipelineConfig, parallelize

    dims = ParallelDims(dp_shard=-1, tp=2, pp=2)
    print(dims.layout())                       # which ranks form the TP, PP and DP groups
    model = parallelize(model, dims, pipeline=PipelineConfig("1F1B", microbatches=4))
    loss = model.train_step(tokens, targets)

``trainjob.torch.prepare_model(model, parallel=dims, pipeline=...)`` does the same. FSDP, DDP and activation
checkpointing are :mod:`trainjob.torch.wrap`'s, shared with ``prepare_model`` and re-exported here.
"""

from trainjob.torch.parallel.compose import ParallelModel, parallelize
from trainjob.torch.parallel.dims import MESH_DIM_NAMES, ParallelDims
from trainjob.torch.parallel.pipeline import SCHEDULES, PipelineConfig, check_microbatches
from trainjob.torch.parallel.stages import split_layers
from trainjob.torch.parallel.tensor import apply_tp, check_tp_plan, transformer_plan
from trainjob.torch.wrap import apply_activation_checkpointing, apply_ddp, apply_fsdp

__all__ = [
    "MESH_DIM_NAMES",
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
    "parallelize",
    "split_layers",
    "transformer_plan",
]
