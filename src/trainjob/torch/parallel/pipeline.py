"""Pipeline parallelism: run a model's stages (see :mod:`~trainjob.torch.parallel.stages`) under a PyTorch schedule.

=========================  ===============  ====================  ==========================================
schedule                   stages per rank  placement of stage s  micro-batches ``m`` (``S`` = all stages)
=========================  ===============  ====================  ==========================================
``GPipe``                  1                rank ``s % pp``       any
``1F1B``                   1                rank ``s % pp``       ``m >= S``
``LoopedBFS``              >= 1 (2)         rank ``s % pp``       any
``Interleaved1F1B``        >= 1 (2)         rank ``s % pp``       ``m % max(1, m // pp) == 0`` (a multiple
                                                                  of ``pp`` always works)
``InterleavedZeroBubble``  >= 1 (2)         rank ``s % pp``       as ``Interleaved1F1B``
``ZBVZeroBubble``          2                V: ranks ``r`` and    any
                                            ``2 pp - 1 - r``
``DualPipeV``              2                V, as above           ``m >= S``
=========================  ===============  ====================  ==========================================

Each schedule computes ``loss_fn`` per micro-batch on the last stage and divides the accumulated gradients by
``m`` (``scale_grads=True``), so with a mean-reducing loss and equal micro-batches the gradients equal those of one
pass over the whole batch. Stages are built with example inputs and outputs computed on a meta-device copy of the
model, so no shapes are exchanged between ranks at run time::

    config = PipelineConfig(schedule="Interleaved1F1B", microbatches=4)
    model = parallelize(GPT(cfg), ParallelDims(dp_shard=-1, pp=2), pipeline=config)
    loss = model.train_step(tokens, targets)     # forward + backward over 4 micro-batches, on 4 stages
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)

from trainjob.errors import ValidationError
from trainjob.torch.parallel.loss import LossFn
from trainjob.torch.parallel.stages import stage_to_rank

__all__ = [
    "SCHEDULES",
    "LossFn",
    "PipelineConfig",
    "PipelineRunner",
    "ScheduleRule",
    "check_microbatches",
]


@dataclass(frozen=True)
class ScheduleRule:
    """What a schedule accepts: its class, stage placement and micro-batch rule."""

    cls: type
    style: Literal["loop", "v"]
    single_stage: bool
    min_microbatches: Literal["one", "stages"]
    rounds_rule: bool = False


SCHEDULES: dict[str, ScheduleRule] = {
    "GPipe": ScheduleRule(ScheduleGPipe, "loop", True, "one"),
    "1F1B": ScheduleRule(Schedule1F1B, "loop", True, "stages"),
    "LoopedBFS": ScheduleRule(ScheduleLoopedBFS, "loop", False, "one"),
    "Interleaved1F1B": ScheduleRule(ScheduleInterleaved1F1B, "loop", False, "one", rounds_rule=True),
    "InterleavedZeroBubble": ScheduleRule(
        ScheduleInterleavedZeroBubble, "loop", False, "one", rounds_rule=True
    ),
    "ZBVZeroBubble": ScheduleRule(ScheduleZBVZeroBubble, "v", False, "one"),
    "DualPipeV": ScheduleRule(ScheduleDualPipeV, "v", False, "stages"),
}


@dataclass(frozen=True)
class PipelineConfig:
    """How to pipeline: schedule name (see :data:`SCHEDULES`), micro-batches, stages per rank, split points.

    ``microbatches`` defaults to the number of stages; ``stages_per_rank`` to 1 for ``GPipe``/``1F1B`` and 2
    otherwise. ``split_points`` (``("layers.2", "layers.5")``) names the layers that begin a new stage; without
    them the layers are divided as evenly as possible, earlier stages taking the remainder::

        PipelineConfig(schedule="ZBVZeroBubble", microbatches=8)
    """

    schedule: str = "1F1B"
    microbatches: int | None = None
    stages_per_rank: int | None = None
    split_points: tuple[str, ...] | None = None

    def rule(self) -> ScheduleRule:
        if self.schedule not in SCHEDULES:
            raise ValidationError(
                "pipeline.schedule", f"must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        return SCHEDULES[self.schedule]

    def resolved_stages_per_rank(self) -> int:
        rule = self.rule()
        spr = self.stages_per_rank if self.stages_per_rank is not None else 1 if rule.single_stage else 2
        if rule.single_stage and spr != 1:
            raise ValidationError(
                "pipeline.stages_per_rank", f"{self.schedule} runs 1 stage per rank, got {spr}"
            )
        if rule.style == "v" and spr != 2:
            raise ValidationError(
                "pipeline.stages_per_rank", f"{self.schedule} runs 2 stages per rank, got {spr}"
            )
        if spr < 1:
            raise ValidationError("pipeline.stages_per_rank", f"must be >= 1, got {spr}")
        return spr


def check_microbatches(schedule: str, microbatches: int, pp: int, num_stages: int) -> None:
    """Raise :class:`ValidationError` naming a working value when ``schedule`` cannot run ``microbatches``."""
    rule = PipelineConfig(schedule=schedule).rule()
    if microbatches < 1:
        raise ValidationError("pipeline.microbatches", f"must be >= 1, got {microbatches}")
    if rule.min_microbatches == "stages" and microbatches < num_stages:
        raise ValidationError(
            "pipeline.microbatches",
            f"{schedule} needs at least as many micro-batches as stages ({num_stages}), got {microbatches}",
        )
    if rule.rounds_rule and microbatches >= pp:
        rounds = microbatches // pp
        if microbatches % rounds:
            raise ValidationError(
                "pipeline.microbatches",
                f"{schedule} runs micro-batches in rounds of about pp={pp}: {microbatches} is not a multiple of "
                f"{rounds} rounds; use a multiple of {pp} such as {rounds * pp}",
            )


class PipelineRunner:
    """Runs this rank's stages under one schedule; :func:`~trainjob.torch.parallel.parallelize` builds it.

    PyTorch's stages and schedule are made at the first :meth:`step` for each batch shape, from example tensors
    of that shape worked out on ``shape_model`` (a meta-device copy of the unsplit model).
    """

    def __init__(
        self,
        *,
        parts: list[nn.Module],
        stage_indices: list[int],
        stage_layers: list[list[str]],
        shape_model: nn.Module,
        config: PipelineConfig,
        pp_mesh: DeviceMesh,
        loss_fn: LossFn,
        device: torch.device,
        activation_dtype: torch.dtype | None = None,
        seq_shards: int = 1,
    ) -> None:
        self.parts = parts
        self.stage_indices = stage_indices
        self.stage_layers = stage_layers
        self.num_stages = len(stage_layers)
        self.config = config
        self.rule = config.rule()
        self.pp_mesh = pp_mesh
        self.loss_fn = loss_fn
        self.device = device
        self.microbatches = config.microbatches if config.microbatches is not None else self.num_stages
        self._shape_model = shape_model
        self._activation_dtype = activation_dtype
        self._seq_shards = seq_shards
        self._schedules: dict[tuple[tuple[int, ...], torch.dtype], Any] = {}
        check_microbatches(config.schedule, self.microbatches, pp_mesh.size(), self.num_stages)
        self.last_stage_rank = stage_to_rank(self.num_stages, pp_mesh.size(), self.rule.style)[-1]

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_indices

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_indices

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward over ``microbatches`` slices of the batch; returns the mean loss on every rank."""
        self._check_batch(inputs)
        schedule = self._schedule_for(inputs)
        losses: list[torch.Tensor] = []
        args = (inputs.to(self.device),) if self.has_first_stage else ()
        if self.has_last_stage:
            schedule.step(*args, target=targets.to(self.device), losses=losses)
        else:
            schedule.step(*args)
        return self._share_loss(losses)

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward only, stage after stage for each micro-batch (the schedules' own ``eval`` cannot run the
        multi-stage schedules); returns the mean loss on every rank. Call it under ``torch.no_grad()``."""
        self._check_batch(inputs)
        examples = self._boundary_examples(inputs)
        placement = stage_to_rank(self.num_stages, self.pp_mesh.size(), self.rule.style)
        me, group = self.pp_mesh.get_local_rank(), self.pp_mesh.get_group()
        parts = dict(zip(self.stage_indices, self.parts, strict=True))
        losses = []
        for micro_inputs, micro_targets in zip(
            inputs.chunk(self.microbatches), targets.chunk(self.microbatches), strict=True
        ):
            hidden = micro_inputs.to(self.device)
            for stage in self.stage_indices:
                source = placement[stage - 1] if stage > 0 else me
                if source != me:
                    hidden = torch.empty(
                        examples[stage].shape, dtype=examples[stage].dtype, device=self.device
                    )
                    dist.recv(hidden, group=group, group_src=source)
                hidden = parts[stage](hidden)
                if stage == self.num_stages - 1:
                    losses.append(self.loss_fn(hidden, micro_targets.to(self.device)))
                elif placement[stage + 1] != me:
                    dist.send(hidden.contiguous(), group=group, group_dst=placement[stage + 1])
        return self._share_loss(losses)

    def _check_batch(self, inputs: torch.Tensor) -> None:
        if inputs.shape[0] % self.microbatches:
            raise ValidationError(
                "batch", f"batch size {inputs.shape[0]} is not divisible by {self.microbatches} micro-batches"
            )
        if inputs.shape[1] % self._seq_shards:
            raise ValidationError(
                "batch",
                f"sequence length {inputs.shape[1]} is not divisible by tp={self._seq_shards} (sequence parallel)",
            )

    def _share_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """The mean of the last stage's micro-batch losses, broadcast to every rank of the pipeline."""
        if self.has_last_stage:
            loss = torch.stack([item.detach().float() for item in losses]).mean()
        else:
            loss = torch.zeros((), device=self.device)
        dist.broadcast(loss, group=self.pp_mesh.get_group(), group_src=self.last_stage_rank)
        return loss

    def _schedule_for(self, inputs: torch.Tensor) -> Any:
        key = (tuple(inputs.shape), inputs.dtype)
        if key not in self._schedules:
            boundaries = self._boundary_examples(inputs)
            stages = [
                PipelineStage(
                    part,
                    index,
                    self.num_stages,
                    self.device,
                    input_args=boundaries[index],
                    output_args=boundaries[index + 1],
                    group=self.pp_mesh.get_group(),
                )
                for part, index in zip(self.parts, self.stage_indices, strict=True)
            ]
            stage_arg = stages[0] if self.rule.single_stage else stages
            self._schedules[key] = self.rule.cls(stage_arg, self.microbatches, loss_fn=self.loss_fn)
        return self._schedules[key]

    def _boundary_examples(self, inputs: torch.Tensor) -> list[torch.Tensor]:
        """Example tensors at each stage boundary for one micro-batch: the model input, every stage's output."""
        micro = torch.empty(
            (inputs.shape[0] // self.microbatches, *inputs.shape[1:]), dtype=inputs.dtype, device="meta"
        )
        layers = self._shape_model.get_submodule("layers")
        outputs: dict[str, torch.Tensor] = {}
        hooks = [
            layers[names[-1]].register_forward_hook(
                lambda _m, _i, out, name=names[-1]: outputs.__setitem__(name, out)
            )
            for names in self.stage_layers[:-1]
        ]
        model = self._shape_model.to(self._activation_dtype) if self._activation_dtype else self._shape_model
        try:
            with torch.no_grad():
                final = model(micro)
        finally:
            for hook in hooks:
                hook.remove()
        # Activations crossing a boundary carry gradients back; the examples must say so.
        hidden = [self._local(outputs[names[-1]]).requires_grad_() for names in self.stage_layers[:-1]]
        return [micro, *hidden, final.requires_grad_()]

    def _local(self, hidden: torch.Tensor) -> torch.Tensor:
        """The per-rank shape of a hidden state when sequence parallelism splits dim 1 across ``seq_shards``."""
        if self._seq_shards == 1:
            return hidden
        shape = list(hidden.shape)
        shape[1] //= self._seq_shards
        return torch.empty(shape, dtype=hidden.dtype, device="meta")
