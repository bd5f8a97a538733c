"""The Kubeflow SDK's initializer types (``kubeflow.trainer``, SDK 0.5), with its names and fields, so code that
passes ``initializer=Initializer(...)`` to ``train()`` ports by changing its import::

    from trainjob import Initializer, HuggingFaceDatasetInitializer, S3ModelInitializer

    client.train(initializer=Initializer(dataset=HuggingFaceDatasetInitializer(storage_uri="hf://org/data"),
                                         model=S3ModelInitializer(storage_uri="s3://models/tiny",
                                                                  endpoint="http://minio:9000")),
                 trainer=CustomTrainer(func=train))

A TrainJob's ``spec.initializer.dataset`` / ``.model`` gets ``storageUri`` and, as the Kubeflow SDK writes them,
every other field that is set as an upper-cased env var (lists joined by commas). :mod:`trainjob.initializers`
reads them back. ``DataCacheInitializer`` (Kubeflow's distributed data cache) is accepted as a type and refused
when a job is made of it: that cache is not part of trainjob.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from trainjob.errors import ValidationError

#: Kubeflow SDK's ``INITIALIZER_DEFAULT_IGNORE_PATTERNS``: a model's files that training does not read.
INITIALIZER_DEFAULT_IGNORE_PATTERNS = ["*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth"]


@dataclass
class BaseInitializer:
    """Base of every initializer: where to fetch from."""

    storage_uri: str


def _check_scheme(value: BaseInitializer, scheme: str) -> None:
    if not isinstance(value.storage_uri, str) or not value.storage_uri.startswith(f"{scheme}://"):
        raise ValueError(f"storage_uri must start with '{scheme}://', got {value.storage_uri}")


@dataclass
class HuggingFaceDatasetInitializer(BaseInitializer):
    """A dataset repository of a Hugging Face Hub: ``hf://<owner>/<name>`` (``hf://`` is added when missing)."""

    ignore_patterns: list[str] | None = None
    access_token: str | None = None


@dataclass
class S3DatasetInitializer(BaseInitializer):
    """Objects under ``s3://<bucket>/<prefix>`` of any S3-compatible server."""

    ignore_patterns: list[str] | None = None
    endpoint: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    region: str | None = None
    role_arn: str | None = None

    def __post_init__(self) -> None:
        _check_scheme(self, "s3")


@dataclass
class DataCacheInitializer(BaseInitializer):
    """Kubeflow's distributed data cache (``cache://<schema>/<table>``): accepted as a type, refused at submission."""

    metadata_loc: str
    num_data_nodes: int
    head_cpu: str | None = None
    head_mem: str | None = None
    worker_cpu: str | None = None
    worker_mem: str | None = None
    iam_role: str | None = None


@dataclass
class HuggingFaceModelInitializer(BaseInitializer):
    """A model repository of a Hugging Face Hub: ``hf://<owner>/<name>``."""

    ignore_patterns: list[str] | None = field(default_factory=lambda: list(INITIALIZER_DEFAULT_IGNORE_PATTERNS))
    access_token: str | None = None


@dataclass
class S3ModelInitializer(BaseInitializer):
    """A model's files under ``s3://<bucket>/<prefix>``."""

    ignore_patterns: list[str] | None = field(default_factory=lambda: list(INITIALIZER_DEFAULT_IGNORE_PATTERNS))
    endpoint: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    region: str | None = None
    role_arn: str | None = None

    def __post_init__(self) -> None:
        _check_scheme(self, "s3")


DatasetInitializer = HuggingFaceDatasetInitializer | S3DatasetInitializer | DataCacheInitializer
ModelInitializer = HuggingFaceModelInitializer | S3ModelInitializer


@dataclass
class Initializer:
    """The dataset and model a job's nodes find in ``/workspace/dataset`` and ``/workspace/model``."""

    dataset: DatasetInitializer | None = None
    model: ModelInitializer | None = None


def initializer_spec(initializer: Any) -> dict[str, Any] | None:
    """``spec.initializer`` of a TrainJob for ``initializer`` (trainjob's types, or the Kubeflow SDK's: same
    fields); ``None`` when it names neither a dataset nor a model. ``ValidationError`` for what is refused."""
    if initializer is None:
        return None
    dataset, model = getattr(initializer, "dataset", None), getattr(initializer, "model", None)
    if dataset is None and model is None:
        if not hasattr(initializer, "dataset"):
            raise ValidationError("initializer", f"must be an Initializer(dataset=..., model=...), got "
                                  f"{type(initializer).__name__}")
        return None
    spec: dict[str, Any] = {}
    if dataset is not None:
        if type(dataset).__name__ == "DataCacheInitializer":
            raise ValidationError("initializer.dataset", "DataCacheInitializer (Kubeflow's distributed data cache) "
                                  "is not part of trainjob; use HuggingFaceDatasetInitializer or S3DatasetInitializer")
        spec["dataset"] = _source(dataset, "initializer.dataset", ("HuggingFaceDatasetInitializer",
                                                                   "S3DatasetInitializer"))
    if model is not None:
        spec["model"] = _source(model, "initializer.model", ("HuggingFaceModelInitializer", "S3ModelInitializer"))
    return spec


def _source(value: Any, path: str, accepted: tuple[str, ...]) -> dict[str, Any]:
    if type(value).__name__ not in accepted or not hasattr(value, "__dataclass_fields__"):
        raise ValidationError(path, f"must be one of {', '.join(accepted)}, got {type(value).__name__}")
    uri = value.storage_uri
    if type(value).__name__.startswith("HuggingFace") and not uri.startswith("hf://"):
        uri = "hf://" + uri  # as the Kubeflow SDK's TorchTune path does
    env = []
    for item in fields(value):
        if item.name == "storage_uri":
            continue
        setting = getattr(value, item.name)
        if setting is None:
            continue
        text = ",".join(str(v) for v in setting) if isinstance(setting, list) else str(setting)
        env.append({"name": item.name.upper(), "value": text})
    out: dict[str, Any] = {"storageUri": uri}
    if env:
        out["env"] = env
    return out
