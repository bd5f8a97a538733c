"""Run a function in several real processes with a gloo process group, on this machine.

Used by the test suite and handy for trying a distributed snippet without a launcher::

    from trainjob.torch.testing import run_distributed

    ranks = run_distributed("mypkg.checks:all_reduce_sum", nproc=4, kwargs={"value": 1.0})

``target`` names an importable function (``"package.module:function"``); each process joins a gloo process group
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set the way torchrun sets them), calls
it with ``**kwargs`` and the return values come back in rank order. A failure in any rank stops the others and
raises :class:`DistributedRunError` with that rank's traceback.

The ``timeout`` is a guard against a hang (a rank waiting forever on a collective), not a measure of speed: it
counts the time the ranks ran or waited on each other, not the time they waited for a CPU. On a machine busier than
its cores (a test run beside others) the same run takes longer in wall-clock time without coming closer to its
limit. :class:`RunnableClock` is that clock, for any group of processes.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import pickle
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from trainjob.ports import free_port
from trainjob.runnable import MAX_STRETCH, RunnableClock

__all__ = ["MAX_STRETCH", "DistributedRunError", "RunnableClock", "free_port", "run_distributed"]


class DistributedRunError(RuntimeError):
    """A rank raised, exited without a result, or the run timed out."""


def _resolve(target: str) -> Any:
    module_name, _, func_name = target.partition(":")
    if not module_name or not func_name:
        raise ValueError(f"target must look like 'package.module:function', got {target!r}")
    return getattr(importlib.import_module(module_name), func_name)


def _child(target: str, rank: int, nproc: int, port: int, kwargs: dict[str, Any], out_dir: str, init: bool) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(out_dir) / f"rank{rank}.pkl"
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        if init:
            dist.init_process_group("gloo", rank=rank, world_size=nproc)
        result: tuple[str, Any] = ("ok", _resolve(target)(**kwargs))
    except BaseException:  # noqa: BLE001 - every failure is reported to the parent
        result = ("error", traceback.format_exc())
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result))
    tmp.replace(out)
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the result is already written
        pass


def run_distributed(
    target: str,
    nproc: int,
    kwargs: dict[str, Any] | None = None,
    *,
    timeout: float = 120.0,
    init_process_group: bool = True,
) -> list[Any]:
    """Run ``target(**kwargs)`` in ``nproc`` processes and return their results in rank order."""
    if nproc < 1:
        raise ValueError(f"nproc: must be >= 1, got {nproc}")
    _resolve(target)  # fail fast, in the caller, on a bad target
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="trainjob-dist-") as out_dir:
        procs = [
            ctx.Process(
                target=_child,
                args=(target, rank, nproc, port, dict(kwargs or {}), out_dir, init_process_group),
                daemon=True,
            )
            for rank in range(nproc)
        ]
        for proc in procs:
            proc.start()
        start = time.monotonic()
        results: dict[int, tuple[str, Any]] = {}
        clock = RunnableClock(lambda: [p.pid for r, p in enumerate(procs) if r not in results and p.pid is not None])
        try:
            while len(results) < nproc:
                for rank in range(nproc):
                    path = Path(out_dir) / f"rank{rank}.pkl"
                    if rank not in results and path.exists():
                        results[rank] = pickle.loads(path.read_bytes())
                        if results[rank][0] == "error":
                            raise DistributedRunError(f"rank {rank} of {nproc} failed:\n{results[rank][1]}")
                for rank, proc in enumerate(procs):
                    # A rank that exited without writing a result died (signal, os._exit, OOM kill).
                    if rank not in results and proc.exitcode is not None:
                        time.sleep(0.2)
                        if not (Path(out_dir) / f"rank{rank}.pkl").exists():
                            raise DistributedRunError(
                                f"rank {rank} of {nproc} exited with code {proc.exitcode} before returning"
                            )
                if clock.read() > timeout:
                    missing = sorted(set(range(nproc)) - set(results))
                    raise DistributedRunError(
                        f"timed out after {timeout:.0f}s waiting for ranks {missing} (not counting "
                        f"{time.monotonic() - start - clock.elapsed:.0f}s they waited for a CPU)"
                    )
                time.sleep(0.05)
        finally:
            for proc in procs:
                proc.join(timeout=10 if len(results) == nproc else 0.5)
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=5)
        # Exit codes after every result arrived are ignored on purpose: CPU processes that used a DeviceMesh
        # sometimes abort in interpreter teardown after their work finished.
        return [results[rank][1] for rank in range(nproc)]
