"""Which layout this process's data loaders shard by: the one the model was last prepared with.

``parallelize`` records its :class:`~trainjob.torch.parallel.ParallelDims` here and a plain ``prepare_model`` clears
it; :func:`trainjob.torch.prepare_data_loader` (built without ``rank=``) reads it, so the ranks of one tensor-parallel
or pipeline group read the same batches. This module imports nothing, so the data-parallel path never loads the
parallel package::

    set_current_layout(dims)     # parallelize
    current_layout()             # dims, or None: data parallel over every rank
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainjob.torch.parallel.dims import ParallelDims

__all__ = ["current_layout", "set_current_layout"]

_current: ParallelDims | None = None


def set_current_layout(dims: ParallelDims | None) -> None:
    """Record the layout of the model this process prepared last (``parallelize`` sets it, a plain
    ``prepare_model`` clears it): data loaders prepared without ``rank=`` shard by its data-parallel rank."""
    global _current
    _current = dims


def current_layout() -> ParallelDims | None:
    """The layout set by the last ``parallelize`` in this process, or ``None`` (data parallel over every rank)."""
    return _current
