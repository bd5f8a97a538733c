"""Sharded, atomic checkpoints through ``torch.distributed.checkpoint`` (DCP), and resume from the newest.

Every rank writes its own shards (FSDP and tensor-parallel DTensors included, through
``get_state_dict``/``set_state_dict``), so loading at another world size reshards on the fly. A checkpoint holds
the model, the optimizer, the step, the data loader's position (epoch and samples consumed), every rank's random
generators and any other object with ``state_dict``/``load_state_dict`` (LR scheduler, GradScaler).

On disk::

    checkpoints/
      step-00000200/        committed: .metadata, __0_0.distcp, ..., trainjob.json
      step-00000300/
      .partial-step-00000400/   being written, or left by a crash: never loaded, removed by the next save

Shards go to a ``.partial-`` directory; rank 0 renames it to ``step-NNNNNNNN`` only after DCP wrote the metadata,
which it does once every rank's shards are on disk. A crash at any point before the rename leaves the previous
checkpoint the newest one. Every rank writes into ``directory``, so across nodes it must be shared storage.
At another world size, ranks the checkpoint has no random-generator state for keep their own seeding. With
``elastic=ElasticConfig(...)`` (:mod:`trainjob.torch.elastic`) a resume at another world size also scales the
learning rate and reports the resize, and a save lets a returning node join right after it. ::

    ckpt = Checkpointer("checkpoints", keep_last=3)
    start = ckpt.resume(model, optimizer, loader=loader)        # 0 on a fresh start
    for step in range(start, total_steps):
        ...
        if (step + 1) % 100 == 0:
            ckpt.save(step + 1, model, optimizer, loader=loader)

A save that fails removes its ``.partial-`` directory (the previous checkpoint stays the newest) and raises an
ordinary exception on every rank, never torch's ``CheckpointException`` (a ``BaseException``):
:class:`~trainjob.errors.DiskFullError` (``no space left on device: PATH (needed ~X, Y free)``) when the
filesystem was full, else :class:`~trainjob.errors.CheckpointError` naming the cause and the ranks
(:mod:`trainjob.torch.checkpoint_failures`). With ``on_disk_full="continue"`` (or
``TRAINJOB_CHECKPOINT_ON_DISK_FULL=continue`` in the job's environment) a save that does not fit is skipped
instead: :meth:`Checkpointer.save` warns and returns ``None``, and training goes on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.optim import Optimizer

from trainjob.errors import CheckpointError, DiskFullError, NotFoundError, ValidationError
from trainjob.torch import checkpoint_failures as failures
from trainjob.torch import elastic as elastic_support
from trainjob.torch import env
from trainjob.torch.seed import capture_rng_state, restore_rng_state

__all__ = ["CheckpointError", "Checkpointer", "DiskFullError"]

_COMMITTED = re.compile(r"^step-(\d{8,})$")
_PARTIAL_PREFIX = ".partial-"
_STALE_PREFIX = ".stale-"
_INFO_FILE = "trainjob.json"
_RESERVED = frozenset({"model", "optimizer", "trainer", "loader", "rng"})


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpointer:
    """Save and load training state under ``directory``; keep the newest ``keep_last`` (``None``: keep all).

    With ``async_save=True``, :meth:`save` returns once the state is copied to host memory and the files are
    written in the background; the next :meth:`save`, :meth:`wait` or :func:`trainjob.torch.shutdown` waits.
    ``on_disk_full``: ``"fail"`` (raise :class:`~trainjob.errors.DiskFullError`) or ``"continue"`` (skip that
    checkpoint); ``None`` reads ``$TRAINJOB_CHECKPOINT_ON_DISK_FULL``, else ``"fail"``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        keep_last: int | None = 3,
        async_save: bool = False,
        elastic: elastic_support.ElasticConfig | None = None,
        on_disk_full: str | None = None,
    ):
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
            raise ValidationError("keep_last", f"must be an integer >= 1 or None, got {keep_last!r}")
        if elastic is not None and not isinstance(elastic, elastic_support.ElasticConfig):
            raise ValidationError("elastic", f"must be a trainjob.torch.ElasticConfig or None, got {type(elastic).__name__}")
        self.elastic = elastic
        self.on_disk_full = failures.on_disk_full_setting(on_disk_full)
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.async_save = async_save
        self._pending: Future[Any] | None = None
        self._pending_commit: tuple[Path, Path, int, int] | None = None
        #: The background save's unfinished and final paths, its step and size, on every rank.
        self._pending_save: tuple[Path, Path, int, int] | None = None
        self._commit_lock = threading.Lock()
        self._async_group: dist.ProcessGroup | None = None
        #: ``trainjob.json`` of the checkpoint :meth:`load` loaded last.
        self.loaded_info: dict[str, Any] = {}

    # -- layout ---------------------------------------------------------------------------------------------

    def path(self, step: int) -> Path:
        """Where the checkpoint of ``step`` lives once committed."""
        return self.directory / f"step-{step:08d}"

    def steps(self) -> list[int]:
        """Steps of the committed checkpoints, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for entry in self.directory.iterdir():
            match = _COMMITTED.match(entry.name)
            if match and (entry / _INFO_FILE).is_file():
                found.append(int(match.group(1)))
        return sorted(found)

    def latest_step(self) -> int | None:
        """The newest committed step, or ``None``."""
        steps = self.steps()
        return steps[-1] if steps else None

    # -- save -----------------------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: Optimizer | None = None,
        *,
        loader: Stateful | None = None,
        **others: Stateful,
    ) -> Path | None:
        """Write the state after ``step`` steps; collective: every rank calls it. Returns the checkpoint path
        (``None`` when a full disk skipped it, with ``on_disk_full="continue"``).

        ``others`` are saved under their keyword (``scheduler=scheduler, scaler=scaler``)::

            ckpt.save(step, model, optimizer, loader=loader, scheduler=scheduler)

        Raises :class:`~trainjob.errors.DiskFullError` when the checkpoint does not fit, and
        :class:`~trainjob.errors.CheckpointError` when it fails otherwise; either way on every rank, with the
        unfinished checkpoint removed and the previous one still the newest.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValidationError("step", f"must be an integer >= 0, got {step!r}")
        self._check_names(others)
        self.wait()
        ctx = env.init()
        final = self.path(step)
        partial = self.directory / f"{_PARTIAL_PREFIX}{final.name}"
        state = self._state_to_save(step, ctx.rank, model, optimizer, loader, others)
        target = (partial, final, step, failures.state_bytes(state))
        if self._settle(target, action=lambda: self._prepare(partial)):
            return None
        commit = (partial, final, step, ctx.world_size)
        if not self.async_save:
            try:
                dcp.save(state, checkpoint_id=partial)
            except CheckpointException as exc:  # collective: every rank has it
                self._settle(target, failure=exc)
                return None
            if self._settle(target, action=lambda: self._commit(*commit)):
                return None
            if self.elastic is not None:
                elastic_support.grow_gate(step, self.elastic)
            return final
        if self._async_group is None:
            # A group of its own: background collectives must not interleave with the training loop's.
            self._async_group = dist.new_group(backend="gloo")
        try:
            response = dcp.async_save(state, checkpoint_id=partial, process_group=self._async_group)
        except CheckpointException as exc:  # collective: every rank has it
            self._settle(target, failure=exc)
            return None
        future = getattr(response, "upload_completion", response)
        self._pending, self._pending_save = future, target
        if ctx.is_main:
            self._pending_commit = commit
            future.add_done_callback(lambda f: f.exception() is None and self._finish_commit())
        env.on_shutdown(self.wait)
        if self.elastic is not None:
            elastic_support.grow_gate(step, self.elastic, before=self.wait)
        return final

    def wait(self) -> None:
        """Block until a background save is on disk and committed; a failed one raises as :meth:`save` does
        (with ``on_disk_full="continue"`` a full disk only warns). No-op when idle."""
        future, self._pending = self._pending, None
        target, self._pending_save = self._pending_save, None
        if future is None or target is None:
            return
        try:
            future.result()
        except CheckpointException as exc:  # collective: every rank has it
            self._pending_commit = None
            self._settle(target, failure=exc)
            return
        self._finish_commit()

    def _prepare(self, partial: Path) -> None:
        """Rank 0: an empty ``partial`` directory, what earlier saves left unfinished removed."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(f"{_PARTIAL_PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)
        partial.mkdir()

    def _settle(
        self,
        target: tuple[Path, Path, int, int],
        *,
        action: Callable[[], None] | None = None,
        failure: BaseException | None = None,
    ) -> bool:
        """Collective: rank 0 runs ``action`` (when no rank's ``failure`` came first), then every rank learns how
        the save of ``target`` (unfinished path, final path, step, size) stands from rank 0. ``False``: it goes
        on. A failure removes the unfinished checkpoint and raises the same error everywhere; ``True`` when a full
        disk skips the checkpoint (``on_disk_full="continue"``)."""
        partial, final, step, needed = target
        ctx = env.init()
        error: CheckpointError | None = None
        if ctx.is_main:
            if failure is None and action is not None:
                try:
                    action()
                except Exception as exc:
                    failure = exc
            if failure is not None:
                full = failures.is_disk_full(failure, partial, needed)
                shutil.rmtree(partial, ignore_errors=True)
                error = failures.save_failure(failure, final, needed, full)
        if ctx.world_size > 1:
            shared: list[CheckpointError | None] = [error]
            dist.broadcast_object_list(shared, src=0)
            error = shared[0]
        if error is None:
            return False
        if isinstance(error, DiskFullError) and self.on_disk_full == "continue":
            if ctx.is_main:
                print(f"checkpoint of step {step} skipped: {error}; training goes on without it "
                      "(on_disk_full=continue)", file=sys.stderr, flush=True)
            return True
        raise error from failure

    def _finish_commit(self) -> None:
        with self._commit_lock:
            commit, self._pending_commit = self._pending_commit, None
            if commit is not None:
                self._commit(*commit)

    def _commit(self, partial: Path, final: Path, step: int, world_size: int) -> None:
        """Make ``partial`` the checkpoint of ``step`` with one atomic rename, then apply ``keep_last``."""
        info = {"step": step, "world_size": world_size, "nodes": elastic_support.current_nodes(), "saved_at": time.time()}
        with open(partial / _INFO_FILE, "w", encoding="utf-8") as f:
            json.dump(info, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(partial)
        stale = None
        if final.exists():  # the same step saved again: swap, never leave a half-deleted directory in place
            stale = final.with_name(f"{_STALE_PREFIX}{final.name}")
            shutil.rmtree(stale, ignore_errors=True)
            os.replace(final, stale)
        os.replace(partial, final)
        _fsync_dir(self.directory)
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
        if self.keep_last is not None:
            for old in self.steps()[: -self.keep_last]:
                shutil.rmtree(self.path(old), ignore_errors=True)

    def _state_to_save(
        self,
        step: int,
        rank: int,
        model: nn.Module,
        optimizer: Optimizer | None,
        loader: Stateful | None,
        others: dict[str, Stateful],
    ) -> dict[str, Any]:
        state: dict[str, Any] = {
            "model": get_model_state_dict(model),
            "trainer": {"step": step},
            "rng": {f"rank{rank}": capture_rng_state()},
            **others,
        }
        if optimizer is not None:
            state["optimizer"] = get_optimizer_state_dict(model, optimizer)
        if loader is not None:
            state["loader"] = loader
        return state

    # -- load -----------------------------------------------------------------------------------------------

    def load(
        self,
        model: nn.Module,
        optimizer: Optimizer | None = None,
        *,
        loader: Stateful | None = None,
        step: int | None = None,
        **others: Stateful,
    ) -> int:
        """Load the checkpoint of ``step`` (default: the newest) into the given objects; return its step.

        Collective. Raises :class:`~trainjob.errors.NotFoundError` when there is no such checkpoint. Random
        generators are restored on ranks the checkpoint has a state for (all of them at the same world size)::

            step = ckpt.load(model, optimizer)
        """
        self._check_names(others)
        self.wait()
        ctx = env.init()
        chosen = self._agreed_step(step)
        if chosen is None:
            wanted = "checkpoint" if step is None else f"checkpoint of step {step}"
            raise NotFoundError(f"{self.directory}: no {wanted}; committed steps: {self.steps() or 'none'}")
        path = self.path(chosen)
        saved_keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata.keys()
        state: dict[str, Any] = {"model": get_model_state_dict(model), "trainer": {"step": -1}, **others}
        if optimizer is not None:
            state["optimizer"] = get_optimizer_state_dict(model, optimizer)
        if loader is not None:
            state["loader"] = loader
            if self.elastic is not None and hasattr(loader, "elastic"):
                loader.elastic = True  # continue after exactly the samples consumed, at any world size
        rng_key = f"rank{ctx.rank}"
        if any(key.startswith(f"rng.{rng_key}.") for key in saved_keys):
            state["rng"] = {rng_key: capture_rng_state()}
        try:
            dcp.load(state, checkpoint_id=path)
        except CheckpointException as exc:
            raise failures.load_failure(exc, path) from exc
        set_model_state_dict(model, state["model"])
        if optimizer is not None:
            set_optimizer_state_dict(model, optimizer, state["optimizer"])
        if "rng" in state:
            restore_rng_state(state["rng"][rng_key])
        self.loaded_info = self.info(chosen)
        saved_world = self.loaded_info.get("world_size")
        if self.elastic is not None and isinstance(saved_world, int) and saved_world >= 1:
            factor = self.elastic.lr_factor(ctx.world_size, saved_world)
            elastic_support.scale_learning_rate(optimizer, factor, *others.values())
        return int(state["trainer"]["step"])

    def info(self, step: int) -> dict[str, Any]:
        """What was recorded with the checkpoint of ``step``: ``step``, ``world_size``, ``nodes``, ``saved_at``."""
        try:
            return json.loads((self.path(step) / _INFO_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def resume(
        self, model: nn.Module, optimizer: Optimizer | None = None, *, loader: Stateful | None = None, **others: Stateful
    ) -> int:
        """Load the newest checkpoint if there is one; return the step to continue from (0 on a fresh start)::

        for step in range(ckpt.resume(model, optimizer, loader=loader), total_steps):
            ...
        """
        if self._agreed_step(None) is None:
            step, saved = 0, None
        else:
            step = self.load(model, optimizer, loader=loader, **others)
            saved = self.loaded_info
        if self.elastic is not None:
            elastic_support.record_round(step, saved)
        return step

    def _agreed_step(self, step: int | None) -> int | None:
        """Rank 0's choice, broadcast, so every rank loads the same checkpoint even while files change."""
        ctx = env.init()
        choice: list[int | None] = [None]
        if ctx.is_main:
            steps = self.steps()
            if step is None:
                choice[0] = steps[-1] if steps else None
            else:
                choice[0] = step if step in steps else None
        if ctx.world_size > 1:
            dist.broadcast_object_list(choice, src=0)
        return choice[0]

    @staticmethod
    def _check_names(others: dict[str, Stateful]) -> None:
        for name, obj in others.items():
            if name in _RESERVED:
                raise ValidationError(name, f"is a reserved checkpoint key ({', '.join(sorted(_RESERVED))})")
            if not isinstance(obj, Stateful):
                raise ValidationError(name, f"needs state_dict() and load_state_dict(), got {type(obj).__name__}")
