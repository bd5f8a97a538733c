"""Compressed gradient communication for DDP: ``prepare_model(model, "ddp", comm_hook=...)``.

DDP all-reduces gradients in buckets (25 MB); a communication hook decides what actually crosses the network for
each bucket. Four are built in:

============  ==========================================================  =====================================
name          what each rank sends for a bucket of ``N`` float32 values    options (default)
============  ==========================================================  =====================================
``fp16``      the bucket cast to float16, all-reduced: half the bytes      none
              (torch's ``fp16_compress_hook``)
``bf16``      the bucket cast to bfloat16, all-reduced: half the bytes;    none
              bfloat16 keeps float32's range, so no overflow, but only
              8 bits of mantissa (torch's ``bf16_compress_hook``)
``powersgd``  rank-``r`` factors ``P``, ``Q`` of each gradient matrix       ``rank`` (1), ``start_iter`` (10),
              instead of the matrix, with error feedback (Vogels et al.,    ``min_compression_rate`` (2),
              torch's ``PowerSGDState`` + ``powerSGD_hook``); vectors and   ``error_feedback`` (True),
              small matrices are all-reduced as they are                    ``warm_start`` (True)
``topk``      the ``k = ratio * N`` largest-magnitude values of the         ``ratio`` (0.01),
              bucket and their indices, all-gathered; the rest stays in a   ``error_feedback`` (True)
              residual that is added to the next step's gradients (error
              feedback, as seed 002's ``CommunicationOptimizer`` sketches)
============  ==========================================================  =====================================

Bytes each rank sends per bucket, for ``n`` ranks (ring algorithms; see :mod:`trainjob.tools.comm`): no hook
``2(n-1)/n * 4N``; ``fp16``/``bf16`` ``2(n-1)/n * 2N``; ``topk`` an all-gather of ``k`` values and ``k`` int32
indices, ``(n-1) * 8k``: ``2 * ratio * n`` of the uncompressed bytes, so top-k saves less the more ranks there are
(1 % keeps 2 % of the traffic on 2 ranks, 64 % on 64). ``benchmarks/comm_hooks.py`` measures them.

Hooks apply to DDP only: FSDP (ZeRO 1-3) reduce-scatters gradients itself, and tensor-parallel layers are not
wrapped in DDP. ``prepare_model`` says so rather than ignoring the option. Half-precision all-reduce needs the
backend to reduce that dtype: NCCL does; gloo does on recent torch (checked with a one-element all-reduce when the
hook is registered, so an older gloo fails there, by name, instead of in the first backward)::

    model = prepare_model(Net(), "ddp", comm_hook="topk", comm_hook_options={"ratio": 0.01})
    model = prepare_model(Net(), "ddp", comm_hook="powersgd", comm_hook_options={"rank": 2, "start_iter": 100})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from trainjob.errors import ValidationError

__all__ = ["COMM_HOOKS", "CommHook", "TopKState", "check_comm_hook", "register_comm_hook", "topk_hook"]

CommHook = Literal["fp16", "bf16", "powersgd", "topk"]

#: Every hook's options with their defaults.
COMM_HOOKS: dict[str, dict[str, Any]] = {
    "fp16": {},
    "bf16": {},
    "powersgd": {"rank": 1, "start_iter": 10, "min_compression_rate": 2.0, "error_feedback": True, "warm_start": True},
    "topk": {"ratio": 0.01, "error_feedback": True},
}


def check_comm_hook(name: object, options: dict[str, Any] | None) -> dict[str, Any]:
    """The hook's options with defaults filled in; a ValidationError naming what is wrong otherwise::

    check_comm_hook("topk", {"ratio": 0.05})      # {'ratio': 0.05, 'error_feedback': True}
    """
    if not isinstance(name, str) or name not in COMM_HOOKS:
        raise ValidationError("comm_hook", f"must be one of {', '.join(map(repr, COMM_HOOKS))}, got {name!r}")
    defaults = COMM_HOOKS[name]
    given = dict(options or {})
    for key in given:
        if key not in defaults:
            accepted = f"it accepts {', '.join(defaults)}" if defaults else "it takes no options"
            raise ValidationError(f"comm_hook_options.{key}", f"is not an option of the {name!r} hook; {accepted}")
    merged = {**defaults, **given}
    if name == "topk":
        ratio = merged["ratio"]
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
            raise ValidationError("comm_hook_options.ratio", f"must be a fraction in (0, 1], got {ratio!r}")
    if name == "powersgd":
        for key, low in (("rank", 1), ("start_iter", 0)):
            value = merged[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValidationError(f"comm_hook_options.{key}", f"must be an integer >= {low}, got {value!r}")
        rate = merged["min_compression_rate"]
        if isinstance(rate, bool) or not isinstance(rate, int | float) or rate < 1:
            raise ValidationError("comm_hook_options.min_compression_rate", f"must be a number >= 1, got {rate!r}")
        if (merged["error_feedback"] or merged["warm_start"]) and merged["start_iter"] < 2:
            raise ValidationError(
                "comm_hook_options.start_iter",
                f"must be >= 2 with error_feedback or warm_start (DDP settles its buckets in the first two steps), "
                f"got {merged['start_iter']}",
            )
    for key in ("error_feedback", "warm_start"):
        if key in merged and not isinstance(merged[key], bool):
            raise ValidationError(f"comm_hook_options.{key}", f"must be True or False, got {merged[key]!r}")
    return merged


def _check_backend_reduces(dtype: torch.dtype, group: dist.ProcessGroup | None, device: torch.device) -> None:
    """All-reduce one value of ``dtype``: a backend that cannot fails here, with its name, not mid-backward."""
    backend = dist.get_backend(group)
    try:
        probe = torch.ones(1, dtype=dtype, device=device)
        dist.all_reduce(probe, group=group)
    except (RuntimeError, ValueError) as exc:
        raise ValidationError(
            "comm_hook",
            f"the {backend} backend of this torch ({torch.__version__}) cannot all-reduce {dtype} on "
            f"{device.type}: {str(exc).splitlines()[0][:200]}",
        ) from None
    if probe.item() != dist.get_world_size(group):
        raise ValidationError("comm_hook", f"the {backend} backend all-reduced {dtype} wrongly ({probe.item()})")


@dataclass
class TopKState:
    """State of :func:`topk_hook`: the ratio kept, and each bucket's residual (what was not sent yet)."""

    process_group: dist.ProcessGroup | None
    ratio: float = 0.01
    error_feedback: bool = True
    residuals: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)
    values_sent: int = 0  # values (and as many indices) this rank has sent so far, for inspection


def _largest(magnitudes: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest values, in no order. On CPU numpy's introselect (``argpartition``) is about
    5x faster than ``torch.topk`` for a 4M-value bucket; on GPUs ``torch.topk``."""
    if magnitudes.device.type == "cpu" and k < magnitudes.numel():
        import numpy as np

        n = magnitudes.numel()
        return torch.from_numpy(np.argpartition(magnitudes.numpy(), n - k)[n - k :])
    return torch.topk(magnitudes, k, sorted=False).indices


def topk_hook(state: TopKState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Send the ``ratio`` largest-magnitude gradient values of the bucket (plus the residual carried from earlier
    steps), keep the rest as the new residual, and average what every rank sent.

    Each rank picks its own indices, so values and indices are all-gathered (one packed tensor) and summed into a
    dense bucket. Residuals are keyed by the bucket's parameters, so DDP rebuilding its buckets after the first
    step cannot add one bucket's residual to another's gradients.
    """
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buffer = bucket.buffer()
    flat = buffer if buffer.dtype == torch.float32 else buffer.float()
    key = tuple(id(p) for p in bucket.parameters())
    if state.error_feedback:
        residual = state.residuals.get(key)
        if residual is not None and residual.shape == flat.shape:
            flat = flat + residual
    k = max(1, int(flat.numel() * state.ratio))
    indices = _largest(flat.abs(), k)
    values = flat[indices]
    if state.error_feedback:
        residual = flat.clone() if flat is buffer else flat
        residual[indices] = 0
        state.residuals[key] = residual
    # Values and int32 indices in one float32 tensor (indices travel as their bit pattern): one collective.
    packed = torch.cat([values.float(), indices.to(torch.int32).view(torch.float32)])
    gathered = [torch.empty_like(packed) for _ in range(world)]
    state.values_sent += k

    def decompress(fut: torch.futures.Future[Any]) -> torch.Tensor:
        fut.wait()
        dense = torch.zeros(flat.numel(), dtype=torch.float32, device=buffer.device)
        for part in gathered:
            dense.index_add_(0, part[k:].view(torch.int32).long(), part[:k])
        buffer.copy_(dense.div_(world))
        return buffer

    return dist.all_gather(gathered, packed, group=group, async_op=True).get_future().then(decompress)


# DDP checks a hook's annotations against the real classes; under postponed evaluation they would be strings.
topk_hook.__annotations__ = {
    "state": TopKState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


def register_comm_hook(model: nn.Module, name: CommHook, options: dict[str, Any] | None = None) -> Any:
    """Register hook ``name`` on a ``DistributedDataParallel`` model; returns the hook's state (None for casts).

    ``model`` must be DDP: FSDP, tensor-parallel and unwrapped models are refused with the reason::

        register_comm_hook(ddp_model, "powersgd", {"rank": 2})
    """
    settings = check_comm_hook(name, options)
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        raise ValidationError(
            "comm_hook",
            f"communication hooks are DDP's; got {type(model).__name__}, which is not DistributedDataParallel "
            "(FSDP reduce-scatters gradients itself: use strategy='ddp' or zero_stage=0)",
        )
    group = model.process_group
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    device = next(model.parameters()).device
    if name in ("fp16", "bf16"):
        dtype = torch.float16 if name == "fp16" else torch.bfloat16
        _check_backend_reduces(dtype, group, device)
        hook = default_hooks.fp16_compress_hook if name == "fp16" else default_hooks.bf16_compress_hook
        model.register_comm_hook(group, hook)
        return None
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=settings["rank"],
            start_powerSGD_iter=settings["start_iter"],
            min_compression_rate=settings["min_compression_rate"],
            use_error_feedback=settings["error_feedback"],
            warm_start=settings["warm_start"],
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return state
    topk = TopKState(group, ratio=float(settings["ratio"]), error_feedback=settings["error_feedback"])
    model.register_comm_hook(topk, topk_hook)
    return topk
