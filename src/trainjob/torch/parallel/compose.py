"""Compose pipeline, tensor and data parallelism on one device mesh, in that order, from outside the model.

0. :func:`check_parallelize` refuses what cannot work before anything changes;
1. **PP** (:func:`apply_pipeline`) cuts the model into stages and keeps this rank's (one, or two for interleaved /
   V schedules);
2. **TP** (:func:`apply_tensor_parallel`) shards each stage's linear layers over ``mesh["tp"]``;
3. **activation checkpointing** (:func:`apply_stage_checkpointing`) wraps each transformer block;
4. **FSDP** (ZeRO 1-3) or **DDP** (ZeRO 0) (:func:`apply_data_parallel`) over the ``(dp_replicate, dp_shard)``
   mesh: block by block, then each stage as a whole.

The result is a :class:`ParallelModel`: an ``nn.Module`` whose parameters are this rank's share under the original
names (hand it to the optimizer and to :class:`trainjob.torch.Checkpointer`, whose DCP checkpoints then load under
any other layout) and whose :meth:`~ParallelModel.train_step` runs forward and backward, pipelined when ``pp > 1``::

    dims = ParallelDims(dp_shard=-1, tp=2, pp=2)
    model = parallelize(GPT(cfg), dims, pipeline=PipelineConfig("Interleaved1F1B", microbatches=4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for tokens, targets in batches:                     # this data-parallel rank's share of the batch
        loss = model.train_step(tokens, targets)        # mean loss of the global batch, on every rank
        optimizer.step()
        optimizer.zero_grad()
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainjob.errors import ValidationError
from trainjob.torch.clip import clip_grad_norm_
from trainjob.torch.data_layout import set_current_layout
from trainjob.torch.env import init
from trainjob.torch.parallel.dims import ParallelDims
from trainjob.torch.parallel.loss import LossFn, lm_loss
from trainjob.torch.parallel.pipeline import PipelineConfig, PipelineRunner
from trainjob.torch.parallel.stages import build_stage_modules, meta_copy
from trainjob.torch.parallel.tensor import TPPlan, apply_tp, check_tp_plan, transformer_plan
from trainjob.torch.precision import Precision, precision_dtype
from trainjob.torch.wrap import apply_activation_checkpointing, apply_ddp, apply_fsdp

__all__ = [
    "ParallelModel",
    "apply_data_parallel",
    "apply_pipeline",
    "apply_stage_checkpointing",
    "apply_tensor_parallel",
    "check_parallelize",
    "parallelize",
    "stage_blocks",
]


class ParallelModel(nn.Module):
    """This rank's share of a parallelized model, under the original parameter names.

    Its children are the model's top-level pieces this rank holds (``embed``, the ``layers`` of its stages, ...),
    shared with the stage modules in ``parts`` that run them, so ``state_dict`` keys do not depend on the layout.
    ``dp_rank`` and ``dp_size`` say which share of each global batch this rank feeds to :meth:`train_step`::

        share = global_batch_size // model.dp_size
        rows = slice(model.dp_rank * share, (model.dp_rank + 1) * share)
        loss = model.train_step(tokens[rows], targets[rows])
    """

    def __init__(
        self,
        parts: list[nn.Module],
        *,
        dims: ParallelDims,
        mesh: DeviceMesh,
        loss_fn: LossFn,
        pipeline: PipelineRunner | None = None,
    ) -> None:
        super().__init__()
        self.parts = parts  # a plain list: the pieces are registered once, below, under their own names
        self.dims = dims
        self.mesh = mesh
        self.loss_fn = loss_fn
        self.pipeline = pipeline
        layers: dict[str, nn.Module] = {}
        for part in parts:
            inner = part.module if isinstance(part, nn.parallel.DistributedDataParallel) else part
            for name, child in inner.named_children():
                if name == "layers":
                    layers.update(child.named_children())
                elif name in vars(self) or hasattr(ParallelModel, name):
                    raise ValidationError(
                        f"model.{name}", "is a name ParallelModel uses itself; rename the module"
                    )
                elif name not in self._modules:
                    setattr(self, name, child)
        if layers:
            self.layers = nn.ModuleDict(layers)

    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel replicas: which share of the batch it reads."""
        return self.dims.coordinates(dist.get_rank())["dp"]

    @property
    def dp_size(self) -> int:
        return self.dims.dp

    def train(self, mode: bool = True) -> ParallelModel:
        for part in self.parts:
            part.train(mode)
        return super().train(mode)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.pipeline is not None:
            raise ValidationError(
                "parallel.pp", f"with pp={self.dims.pp} the model runs through train_step(inputs, targets)"
            )
        return self.parts[0](inputs)

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward on this replica's batch; returns the global batch's mean loss on every rank."""
        if self.pipeline is not None:
            loss = self.pipeline.step(inputs, targets)
        else:
            loss = self.loss_fn(self(inputs), targets)
            loss.backward()
        return self._global_mean(loss.detach().float())

    @torch.no_grad()
    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward only (no gradients, no parameter changes); the global batch's mean loss on every rank."""
        if self.pipeline is not None:
            loss = self.pipeline.evaluate(inputs, targets)
        else:
            loss = self.loss_fn(self(inputs), targets)
        return self._global_mean(loss.float())

    @property
    def pipeline_group(self) -> dist.ProcessGroup | None:
        """The ranks holding the other pipeline stages (``None`` without pipelining): gradient norms span them."""
        return self.mesh["pp"].get_group() if self.pipeline is not None else None

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale gradients so the norm over every stage's and shard's gradients is at most ``max_norm``; returns
        the norm before clipping, the same on every rank. Same as ``trainjob.torch.clip_grad_norm_(model, ...)``."""
        return clip_grad_norm_(self, max_norm, norm_type)

    def _global_mean(self, loss: torch.Tensor) -> torch.Tensor:
        for dim in ("dp_replicate", "dp_shard"):
            if self.mesh[dim].size() > 1:
                dist.all_reduce(loss, group=self.mesh[dim].get_group())
        return loss / self.dims.dp


def parallelize(
    model: nn.Module,
    parallel: ParallelDims,
    *,
    mixed_precision: Precision | None = None,
    activation_checkpointing: bool = False,
    cpu_offload: bool = False,
    zero_stage: int = 3,
    pipeline: PipelineConfig | None = None,
    tp_plan: TPPlan | None = None,
    sequence_parallel: bool = False,
    loss_fn: LossFn = lm_loss,
    mesh: DeviceMesh | None = None,
) -> ParallelModel:
    """Apply ``parallel``'s PP, TP, activation checkpointing and FSDP/DDP to ``model`` (modified in place).

    Every rank passes the same full model (same seed) and gets back its share. From then on
    :func:`trainjob.torch.prepare_data_loader` shards data by this layout's data-parallel rank: the ranks of one
    tensor-parallel / pipeline group read the same batches. ``tp_plan`` defaults to
    :func:`~trainjob.torch.parallel.tensor.transformer_plan`; ``pipeline`` to ``PipelineConfig()`` (1F1B) when
    ``parallel.pp > 1``; ``loss_fn(outputs, targets)`` is what the last pipeline stage and ``train_step`` compute
    (default: :func:`~trainjob.torch.parallel.loss.lm_loss`).
    Data parallelism uses FSDP2 for ``zero_stage`` 1-3 and DDP for 0 (see :mod:`trainjob.torch.wrap`, shared with
    :func:`trainjob.torch.prepare_model`); ``mixed_precision`` (``"bf16"``/``"fp16"``) and ``cpu_offload`` go
    through FSDP's policies, so they apply FSDP even at ``dp == 1``; without pipelining the model's outputs come
    back in float32, with it activations cross stage boundaries in the compute dtype.
    """
    dtype = precision_dtype(mixed_precision)
    device = init().device
    plan = tp_plan if tp_plan is not None else transformer_plan(sequence_parallel)
    check_parallelize(model, parallel, plan, zero_stage=zero_stage, dtype=dtype, cpu_offload=cpu_offload)
    mesh = mesh or parallel.build_mesh(device.type)
    parts: list[nn.Module] = [model]
    runner: PipelineRunner | None = None
    if parallel.pp > 1:
        parts, runner = apply_pipeline(
            model, parallel, mesh, pipeline or PipelineConfig(), loss_fn=loss_fn, device=device,
            activation_dtype=dtype, sequence_parallel=sequence_parallel,
        )  # fmt: skip
    for part in parts:  # only this rank's stages go to its device
        part.to(device)
    if parallel.tp > 1:
        apply_tensor_parallel(parts, mesh["tp"], plan)
    blocks = stage_blocks(parts)
    if activation_checkpointing:
        blocks = apply_stage_checkpointing(parts, type(model).__name__)
    parts = apply_data_parallel(
        parts, blocks, parallel, mesh, zero_stage=zero_stage, param_dtype=dtype, cpu_offload=cpu_offload,
        float32_outputs=runner is None,
    )  # fmt: skip
    if runner is not None:
        runner.parts = parts  # DDP wrapped the stages the schedule runs
    set_current_layout(parallel)  # data loaders now shard by data-parallel rank (trainjob.torch.data)
    return ParallelModel(parts, dims=parallel, mesh=mesh, loss_fn=loss_fn, pipeline=runner)


def check_parallelize(
    model: nn.Module,
    parallel: ParallelDims,
    plan: TPPlan,
    *,
    zero_stage: int,
    dtype: torch.dtype | None,
    cpu_offload: bool,
) -> None:
    """Refuse a layout this process group, the data-parallel settings or the model cannot take, before anything
    changes: the world size, ``zero_stage`` with precision/offload/TP, and (``tp > 1``) the TP plan's layers."""
    if parallel.world_size != dist.get_world_size():
        raise ValidationError(
            "parallel.world_size",
            f"is {parallel.world_size} but the process group has {dist.get_world_size()} ranks",
        )
    _check_data_parallel(parallel, zero_stage, dtype, cpu_offload)
    if parallel.tp > 1:
        check_tp_plan(model, plan, parallel.tp)


def apply_pipeline(
    model: nn.Module,
    parallel: ParallelDims,
    mesh: DeviceMesh,
    config: PipelineConfig,
    *,
    loss_fn: LossFn,
    device: torch.device,
    activation_dtype: torch.dtype | None,
    sequence_parallel: bool,
) -> tuple[list[nn.Module], PipelineRunner]:
    """Cut ``model`` into stages and keep this rank's (one, or two for interleaved / V schedules); returns them and
    the runner that drives ``config``'s schedule over ``mesh["pp"]``."""
    shape_model = meta_copy(model)
    pp_rank = parallel.coordinates(dist.get_rank())["pp"]
    parts, indices, stage_layers = build_stage_modules(
        model,
        pp=parallel.pp,
        pp_rank=pp_rank,
        stages_per_rank=config.resolved_stages_per_rank(),
        style=config.rule().style,
        split_points=config.split_points,
    )
    runner = PipelineRunner(
        parts=parts,
        stage_indices=indices,
        stage_layers=stage_layers,
        shape_model=shape_model,
        config=config,
        pp_mesh=mesh["pp"],
        loss_fn=loss_fn,
        device=device,
        activation_dtype=activation_dtype,
        seq_shards=parallel.tp if sequence_parallel else 1,
    )
    return parts, runner


def apply_tensor_parallel(parts: list[nn.Module], tp_mesh: DeviceMesh, plan: TPPlan) -> None:
    """Shard each stage's linear layers over ``tp_mesh`` as ``plan`` says (:func:`~.tensor.apply_tp`)."""
    for part in parts:
        apply_tp(part, tp_mesh, plan)


def stage_blocks(parts: list[nn.Module]) -> list[nn.Module]:
    """The transformer blocks of every stage: the children of each one's ``layers``, the FSDP units."""
    return [block for part in parts for block in _blocks(part)]


def apply_stage_checkpointing(parts: list[nn.Module], model_name: str) -> list[nn.Module]:
    """Wrap every stage's blocks in activation checkpointing; returns the wrapped blocks (the FSDP units then)."""
    if not stage_blocks(parts):
        raise ValidationError(
            "activation_checkpointing",
            f"checkpoints the blocks in model.layers; {model_name} has none",
        )
    return [wrapped for part in parts for wrapped in apply_activation_checkpointing(part, _blocks(part))]


def apply_data_parallel(
    parts: list[nn.Module],
    blocks: list[nn.Module],
    parallel: ParallelDims,
    mesh: DeviceMesh,
    *,
    zero_stage: int,
    param_dtype: torch.dtype | None,
    cpu_offload: bool,
    float32_outputs: bool,
) -> list[nn.Module]:
    """DDP over the one data-parallel mesh dimension (``zero_stage=0``), or FSDP2 over ``(dp_replicate, dp_shard)``
    block by block then stage by stage (1-3; also at ``dp == 1`` for its precision and offload policies). Returns
    the stages as they now run: DDP wraps them, FSDP changes them in place. ``float32_outputs``: the root hands
    float32 to the loss (without pipelining)."""
    if zero_stage == 0 and parallel.dp > 1:
        dim = "dp_replicate" if parallel.dp_replicate > 1 else "dp_shard"
        return [apply_ddp(part, mesh[dim]) for part in parts]
    if zero_stage > 0 and (parallel.dp > 1 or param_dtype is not None or cpu_offload):
        dp_mesh = mesh["dp_shard"] if parallel.dp_replicate == 1 else parallel.dp_mesh(mesh)
        apply_fsdp(
            blocks,
            parts,
            dp_mesh,
            zero_stage=zero_stage,
            param_dtype=param_dtype,
            output_dtype=torch.float32 if param_dtype is not None and float32_outputs else None,
            cpu_offload=cpu_offload,
        )
    return parts


def _check_data_parallel(
    dims: ParallelDims, zero_stage: int, dtype: torch.dtype | None, cpu_offload: bool
) -> None:
    if zero_stage not in (0, 1, 2, 3):
        raise ValidationError("zero_stage", f"must be 0 (DDP), 1, 2 or 3 (FSDP), got {zero_stage!r}")
    if zero_stage > 0:
        return
    if dtype is not None or cpu_offload:
        raise ValidationError(
            "zero_stage", "mixed_precision and cpu_offload need FSDP: use zero_stage 1, 2 or 3"
        )
    if dims.dp > 1 and dims.tp > 1:
        raise ValidationError(
            "zero_stage", f"DDP (zero_stage=0) cannot wrap tensor-parallel layers (tp={dims.tp})"
        )
    if dims.dp_replicate > 1 and dims.dp_shard > 1:
        raise ValidationError(
            "zero_stage", "DDP runs over one data-parallel dimension: set dp_replicate or dp_shard to 1"
        )


def _blocks(module: nn.Module) -> list[nn.Module]:
    layers = getattr(module, "layers", None)
    return list(layers.children()) if isinstance(layers, nn.ModuleDict | nn.ModuleList) else []
