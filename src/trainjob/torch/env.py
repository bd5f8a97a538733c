"""Process group and device set-up from the environment torchrun (or the trainjob backends) provides.

torchrun sets, per process:

====================  ==============================================
``RANK``              global rank, ``0 .. WORLD_SIZE-1``
``LOCAL_RANK``        rank on this node; picks the GPU
``WORLD_SIZE``        number of processes in the job
``LOCAL_WORLD_SIZE``  processes on this node
``MASTER_ADDR``       host of the rendezvous store (rank 0's node)
``MASTER_PORT``       its port
====================  ==============================================

Without them the script runs as one process, in a process group of size one, so the same script works under
``python train.py`` and under ``torchrun``::

    ctx = trainjob.torch.init()
    print(ctx.rank, ctx.world_size, ctx.device)   # 0 1 cpu
    ...
    trainjob.torch.shutdown()
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from trainjob.errors import ValidationError
from trainjob.torch import rank_stacks

__all__ = ["DistContext", "context", "global_rank", "global_world_size", "init", "on_shutdown", "shutdown"]

#: How long ``shutdown`` waits for the other ranks before tearing the process group down anyway.
SHUTDOWN_BARRIER_SECONDS = 30.0


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job: ranks, sizes, its device and the process-group backend."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that logs, reports and writes single-copy files."""
        return self.rank == 0


_context: DistContext | None = None
_before_shutdown: list[Callable[[], None]] = []  # callables run by shutdown(), e.g. waiting for async checkpoint saves


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise ValidationError(name, "environment variable is required when WORLD_SIZE is set (torchrun sets it)")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError(name, f"must be an integer, got {raw!r}") from None
    if value < 0:
        raise ValidationError(name, f"must be >= 0, got {value}")
    return value


def _pick_device(local_rank: int) -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ValidationError(
            "LOCAL_RANK", f"{local_rank} has no GPU on this node ({count} visible); start at most {count} processes"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _default_backend(device: torch.device) -> str:
    # CPU collectives stay available next to NCCL (object broadcasts, checkpoint coordination).
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def init(backend: str | None = None, *, timeout: timedelta | None = None) -> DistContext:
    """Join the job's process group (or make a one-process group) and pick this process's device.

    Idempotent: later calls return the same context. A process group someone else initialised is adopted.
    ``backend`` defaults to NCCL (with gloo for CPU tensors) when CUDA is available and gloo otherwise::

        ctx = init()
        model = model.to(ctx.device)
        if ctx.is_main:
            print(f"{ctx.world_size} processes")
    """
    global _context
    if _context is not None and dist.is_initialized():
        return _context
    local_rank = _env_int("LOCAL_RANK", 0)
    device = _pick_device(local_rank)
    if not dist.is_initialized():
        chosen = backend or _default_backend(device)
        kwargs = {"timeout": timeout} if timeout is not None else {}
        if "WORLD_SIZE" in os.environ:
            world_size = _env_int("WORLD_SIZE")
            rank = _env_int("RANK")
            if rank >= world_size:
                raise ValidationError("RANK", f"must be < WORLD_SIZE ({world_size}), got {rank}")
            dist.init_process_group(chosen, rank=rank, world_size=world_size, **kwargs)
        else:
            # One process on its own: an in-memory store, no port, and every distributed API still works.
            dist.init_process_group(chosen, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    world_size = dist.get_world_size()
    _context = DistContext(
        rank=dist.get_rank(),
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=_env_int("LOCAL_WORLD_SIZE", world_size),
        device=device,
        backend=str(dist.get_backend()),
    )
    rank_stacks.start()  # on Kubernetes: this rank's stacks when it stalls or `trainjob stacks` asks
    global _collect_at_exit
    if not _collect_at_exit:
        _collect_at_exit = True
        atexit.register(_collect_process_groups)
    return _context


_collect_at_exit = False


def _collect_process_groups() -> None:
    # A destroyed gloo process group lives on while a model (FSDP's or DDP's hooks, a device mesh) still refers to
    # it, and those references are often cycles that only the interpreter's last collection frees. By then Python is
    # finalizing, and a gloo worker thread that drops a finished collective's tensors must take the GIL to do so: it
    # cannot, and the process aborts ("terminate called without an active exception") after a successful run.
    # Collecting here, while the interpreter is whole, lets the group's destructor join its workers first.
    if not dist.is_initialized():
        gc.collect()


def context() -> DistContext:
    """The current context, initialising on first use (see :func:`init`)."""
    return init()


def global_rank() -> int:
    """This process's global rank without initialising anything: the process group's, else ``$RANK``, else 0."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def global_world_size() -> int:
    """The job's process count without initialising anything: the process group's, else ``$WORLD_SIZE``, else 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return _env_int("WORLD_SIZE", 1)


def on_shutdown(callback: Callable[[], None]) -> None:
    """Run ``callback`` in :func:`shutdown` before the process group goes away (registered once per callback)."""
    if callback not in _before_shutdown:
        _before_shutdown.append(callback)


def shutdown() -> None:
    """Finish pending background work (async checkpoint saves) and destroy the process group.

    Safe to call twice or without :func:`init`::

        shutdown()
    """
    global _context
    while _before_shutdown:
        _before_shutdown.pop()()
    if dist.is_initialized():
        _meet_before_destroy()
        dist.destroy_process_group()
    _context = None


def _meet_before_destroy(timeout: float = SHUTDOWN_BARRIER_SECONDS) -> None:
    # A rank that tears its gloo connections down while a peer is still working makes that peer's transport
    # threads fail, and the process aborts (SIGABRT) after its work is done. Meeting first avoids it; the wait is
    # bounded so that a peer that died already cannot hang the survivors.
    if dist.get_world_size() == 1:
        return
    with contextlib.suppress(Exception):  # a missing peer must not stop this rank from shutting down
        dist.barrier(async_op=True).wait(timeout=timedelta(seconds=timeout))
