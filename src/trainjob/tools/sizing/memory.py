"""Per-GPU memory of a training run, from the formulas the seeds teach.

>>> from trainjob.tools.training_setup import TrainingSetup
>>> setup = TrainingSetup(params=7.5e9, gpus=8, nodes=8, zero=1)        # 64 GPUs, bf16, Adam
>>> round(estimate_memory(setup).model_states / 1e9, 1)                      # 2Ψ + 2Ψ + 12Ψ/64
31.4

Model states per GPU, with ``Ψ`` parameters per model-parallel shard (``params / (tp·pp)``) and ``N`` the
data-parallel degree (mixed-precision Adam: 2 bytes of bf16/fp16 weights, 2 of gradients and ``K = 12`` of fp32
master weights, momentum and variance):

=======  ===================  ===================  ====================
ZeRO     parameters           gradients            optimizer states
=======  ===================  ===================  ====================
0 (DDP)  ``2Ψ``               ``2Ψ``               ``KΨ``
1        ``2Ψ``               ``2Ψ``               ``KΨ / N``
2        ``2Ψ``               ``2Ψ / N``           ``KΨ / N``
3        ``2Ψ / N``           ``2Ψ / N``           ``KΨ / N``
=======  ===================  ===================  ====================

``K`` is 12 for Adam/AdamW in bf16/fp16, 8 in fp32 (no master copy); 8 and 4 for SGD with momentum. ``offload``
moves the optimizer states to host memory (DeepSpeed's ZeRO-Offload); ``cpu_offload`` is what the library's
``parallelize(..., cpu_offload=True)`` does (FSDP2): the shard's parameters and gradients (float32) and optimizer
moments all in host memory, ``(8 + moments)·Ψ/N`` bytes, the GPU holding only the blocks being computed.

With ZeRO-3 (and with ``cpu_offload``) FSDP gathers one transformer block's full parameters at a time and prefetches
the next, and a block's full gradients (float32) exist until they are reduce-scattered: ``gathered`` counts
``(2·2 + 4)·12h²/t`` bytes for that when the shape is known (on top of the paper's model states).

Activations per layer and micro-batch (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", 16-bit values, tensor parallelism without sequence parallelism): ``s·b·h·(10 + 24/t + 5·a·s/(h·t))``
bytes, where the ``5·a·s/(h·t)`` term is the attention score matrices that fused attention kernels
(FlashAttention, ``flash_attention=True``) never store, and that Megatron-LM's selective recomputation recomputes.
Sequence parallelism (``sequence_parallel=True``) splits the remaining ``10·s·b·h`` over the TP ranks too:
``s·b·h·(34/t + 5·a·s/(h·t))``. With full activation checkpointing only each layer's input (``2·s·b·h``, ``/t``
with sequence parallelism) is kept, plus one layer's activations while it is recomputed. With a 1F1B pipeline the first stage holds ``min(pp, m)`` micro-batches of its
``layers/pp`` layers; with GPipe all ``m``; interleaved 1F1B with ``v`` stages per rank ``(1 + (p-1)/(p·v))`` times
1F1B's (Narayanan et al. 2021).

Pipeline bubble (idle share of a step): ``(p-1)/(m+p-1)`` for GPipe and 1F1B, ``(p-1)/(v·m+p-1)`` interleaved.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainjob.tools.training_setup import TrainingSetup


def optimizer_bytes_per_param(optimizer: str, dtype: str) -> int:
    """``K``: optimizer-state bytes per parameter. ``optimizer_bytes_per_param("adam", "bf16") == 12``."""
    moments = 8 if optimizer in ("adam", "adamw") else 4  # Adam: momentum + variance; SGD: momentum
    master_copy = 0 if dtype == "fp32" else 4  # mixed precision keeps fp32 weights for the update
    return moments + master_copy


def pipeline_bubble_fraction(stages: int, micro_batches: int, stages_per_rank: int = 1) -> float:
    """Idle share of a pipelined step, ``(p-1)/(v·m+p-1)`` (``v = 1`` for GPipe/1F1B, 2 for interleaved 1F1B):
    ``pipeline_bubble_fraction(4, 64) == 3/67``."""
    return (stages - 1) / (stages_per_rank * micro_batches + stages - 1)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU. ``activations`` is ``None`` when the model shape (layers, hidden, heads, seq) is unknown."""

    setup: TrainingSetup
    parameters: float
    gradients: float
    optimizer_states: float
    offloaded_to_host: float
    activations: float | None
    activations_checkpointed: float | None
    gathered: float = 0.0

    @property
    def model_states(self) -> float:
        """Parameters + gradients + optimizer states kept on the GPU."""
        return self.parameters + self.gradients + self.optimizer_states

    @property
    def total(self) -> float:
        """Model states, gathered blocks and the activations of the chosen mode (checkpointed or not)."""
        chosen = self.activations_checkpointed if self.setup.activation_checkpointing else self.activations
        return self.model_states + self.gathered + (chosen or 0.0)


def _activation_bytes(setup: TrainingSetup) -> tuple[float, float] | None:
    if not setup.has_shape:
        return None
    s, b, h, a, t = setup.seq, setup.micro_batch, setup.hidden, setup.heads, setup.tp
    assert s is not None and h is not None and a is not None and setup.layers is not None
    scale = setup.value_bytes / 2  # the formula counts 16-bit values
    attention_scores = 0 if setup.flash_attention else 5 * a * s / (h * t)
    split = (34 / t) if setup.sequence_parallel else (10 + 24 / t)
    per_layer = s * b * h * (split + attention_scores) * scale
    layer_input = 2 * s * b * h * scale / (t if setup.sequence_parallel else 1)
    m = setup.micro_batches or 1
    in_flight: float = m if setup.schedule == "GPipe" else min(setup.pp, m)
    v = setup.stages_per_rank
    if v > 1:
        in_flight *= 1 + (setup.pp - 1) / (setup.pp * v)
    held_layers = setup.layers / setup.pp * in_flight
    return held_layers * per_layer, held_layers * layer_input + per_layer


def block_parameters(setup: TrainingSetup) -> float | None:
    """Parameters of one transformer block on one tensor-parallel rank, ``12h²/t`` (None without ``hidden``)."""
    return None if setup.hidden is None else 12 * setup.hidden**2 / setup.tp


def estimate_memory(setup: TrainingSetup) -> MemoryEstimate:
    """Per-GPU memory of ``setup``.

    >>> plan = estimate_memory(TrainingSetup(params=7.5e9, gpus=8, nodes=8, zero=3))
    >>> round(plan.model_states / 1e9, 3)                                  # 16Ψ / 64
    1.875
    """
    psi, n = setup.params_per_gpu, setup.dp
    weights = setup.value_bytes * psi
    optimizer = optimizer_bytes_per_param(setup.optimizer, setup.dtype) * psi / (n if setup.zero >= 1 else 1)
    activations = _activation_bytes(setup)
    block = block_parameters(setup)
    gathered = (2 * setup.value_bytes + 4) * block if block is not None and (setup.zero >= 3 or setup.cpu_offload) else 0.0
    if setup.cpu_offload:
        moments = 8 if setup.optimizer in ("adam", "adamw") else 4
        return MemoryEstimate(
            setup=setup,
            parameters=0.0,
            gradients=0.0,
            optimizer_states=0.0,
            offloaded_to_host=(8 + moments) * psi / n,
            activations=activations[0] if activations else None,
            activations_checkpointed=activations[1] if activations else None,
            # ZeRO-2 keeps every block gathered through the step (reshard_after_forward=False).
            gathered=gathered if setup.zero >= 3 else weights + 4 * (block or 0),
        )
    return MemoryEstimate(
        setup=setup,
        parameters=weights / n if setup.zero >= 3 else weights,
        gradients=weights / n if setup.zero >= 2 else weights,
        optimizer_states=0.0 if setup.offload else optimizer,
        offloaded_to_host=optimizer if setup.offload else 0.0,
        activations=activations[0] if activations else None,
        activations_checkpointed=activations[1] if activations else None,
        gathered=gathered,
    )
