"""The runtimes shipped in the package (``runtime/builtin/*.yaml``) and lookup of a job's ``runtimeRef``.

>>> sorted(builtin_runtimes())
['deepspeed-distributed', 'mpi-distributed', 'ray-distributed', 'torch-distributed', 'torch-distributed-volcano']
>>> find_runtime("torch-distributed").spec.ml_policy.torch.num_proc_per_node
'auto'
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from importlib import resources

from trainjob.api import ClusterTrainingRuntime, Runtime, RuntimeRef, TrainingRuntime, load_resources
from trainjob.api.errors import quote, shorten
from trainjob.api.trainjob import CLUSTER_TRAINING_RUNTIME
from trainjob.errors import NotFoundError

DEFAULT_RUNTIME = "torch-distributed"


@functools.cache
def _load_builtin() -> tuple[ClusterTrainingRuntime, ...]:
    folder = resources.files("trainjob.runtime") / "builtin"
    loaded: list[ClusterTrainingRuntime] = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            loaded += [
                r
                for r in load_resources(entry.read_text(encoding="utf-8"))
                if isinstance(r, ClusterTrainingRuntime)
            ]
    return tuple(loaded)


def builtin_runtimes() -> dict[str, ClusterTrainingRuntime]:
    """The built-in ClusterTrainingRuntimes by name (fresh copies: changing one does not change the next)."""
    return {r.name: r.model_copy(deep=True) for r in _load_builtin()}


def find_runtime(
    ref: RuntimeRef | str, extra_runtimes: Iterable[Runtime] = (), *, namespace: str | None = None
) -> Runtime:
    """The runtime ``ref`` names: first among ``extra_runtimes`` (e.g. from ``-f runtime.yaml``), then built-ins.

    ``ref`` is a :class:`RuntimeRef` or a ClusterTrainingRuntime name. A ``TrainingRuntime`` must be in
    ``namespace`` when one is given. Raises :class:`NotFoundError` naming the runtimes that do exist.
    """
    if isinstance(ref, str):
        ref = RuntimeRef(name=ref)
    candidates: list[Runtime] = [*extra_runtimes, *builtin_runtimes().values()]
    for runtime in candidates:
        if runtime.kind != ref.kind or runtime.name != ref.name:
            continue
        if (
            isinstance(runtime, TrainingRuntime)
            and namespace is not None
            and runtime.metadata.namespace != namespace
        ):
            continue
        return runtime
    known = sorted({r.name for r in candidates if r.kind == ref.kind})
    where = f" in namespace {quote(namespace)}" if ref.kind != CLUSTER_TRAINING_RUNTIME and namespace else ""
    raise NotFoundError(
        f"{ref.kind} {quote(ref.name)} not found{where}; known {ref.kind}s: {shorten(', '.join(known), 400) or 'none'}"
    )
