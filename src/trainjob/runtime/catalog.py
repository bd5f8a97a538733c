"""The runtimes shipped in the package (``runtime/builtin/*.yaml``) and lookup of a job's ``runtimeRef``.

>>> sorted(builtin_runtimes())[:5]
['deepspeed-distributed', 'mpi-distributed', 'ray-distributed', 'torch-distributed', 'torch-distributed-volcano']
>>> sorted(builtin_runtimes())[5:]
['torchtune-llama3.2-1b', 'torchtune-llama3.2-3b', 'torchtune-qwen2.5-1.5b']
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
def _builtin_files() -> tuple[str, ...]:
    folder = resources.files("trainjob.runtime") / "builtin"
    return tuple(sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".yaml")))


@functools.cache
def _load_file(file_name: str) -> tuple[ClusterTrainingRuntime, ...]:
    text = (resources.files("trainjob.runtime") / "builtin" / file_name).read_text(encoding="utf-8")
    return tuple(r for r in load_resources(text) if isinstance(r, ClusterTrainingRuntime))


def builtin_runtimes() -> dict[str, ClusterTrainingRuntime]:
    """The built-in ClusterTrainingRuntimes by name (fresh copies: changing one does not change the next)."""
    return {r.name: r.model_copy(deep=True) for name in _builtin_files() for r in _load_file(name)}


def _builtin_named(name: str) -> ClusterTrainingRuntime | None:
    """The built-in runtime ``name`` read from its own file (``builtin/NAME.yaml``) alone, a fresh copy; ``None``
    when there is no such file (a job names one runtime: ``trainjob run`` need not read and check them all)."""
    if f"{name}.yaml" not in _builtin_files():
        return None
    for runtime in _load_file(f"{name}.yaml"):
        if runtime.name == name:
            return runtime.model_copy(deep=True)
    return None


def find_runtime(
    ref: RuntimeRef | str, extra_runtimes: Iterable[Runtime] = (), *, namespace: str | None = None
) -> Runtime:
    """The runtime ``ref`` names: first among ``extra_runtimes`` (e.g. from ``-f runtime.yaml``), then built-ins.

    ``ref`` is a :class:`RuntimeRef` or a ClusterTrainingRuntime name. A ``TrainingRuntime`` must be in
    ``namespace`` when one is given. Raises :class:`NotFoundError` naming the runtimes that do exist.
    """
    if isinstance(ref, str):
        ref = RuntimeRef(name=ref)
    extra_runtimes = list(extra_runtimes)
    for runtime in extra_runtimes:
        if runtime.kind != ref.kind or runtime.name != ref.name:
            continue
        if (
            isinstance(runtime, TrainingRuntime)
            and namespace is not None
            and runtime.metadata.namespace != namespace
        ):
            continue
        return runtime
    # The built-ins are all ClusterTrainingRuntimes, each in the file named after it: only that file is read.
    builtin = _builtin_named(ref.name) if ref.kind == CLUSTER_TRAINING_RUNTIME else None
    if builtin is not None:
        return builtin
    candidates: list[Runtime] = [*extra_runtimes, *builtin_runtimes().values()]
    known = sorted({r.name for r in candidates if r.kind == ref.kind})
    where = f" in namespace {quote(namespace)}" if ref.kind != CLUSTER_TRAINING_RUNTIME and namespace else ""
    raise NotFoundError(
        f"{ref.kind} {quote(ref.name)} not found{where}; known {ref.kind}s: {shorten(', '.join(known), 400) or 'none'}"
    )
