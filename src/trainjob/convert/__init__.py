"""Manifests of other APIs turned into TrainJobs: Kubeflow Training Operator v1 ``PyTorchJob``
(:mod:`trainjob.convert.pytorchjob`), read from files beside trainer.kubeflow.org resources by :func:`load_resources`."""

from trainjob.api.annotations import conversion_warnings, converted_from
from trainjob.api.io import is_pytorchjob
from trainjob.convert.documents import load_resources
from trainjob.convert.pytorchjob import (
    CONVERSION_WARNINGS_ANNOTATION,
    CONVERTED_FROM_ANNOTATION,
    Conversion,
    convert_pytorchjob,
)
from trainjob.convert.pytorchjob_api import PyTorchJob

__all__ = [
    "CONVERSION_WARNINGS_ANNOTATION",
    "CONVERTED_FROM_ANNOTATION",
    "Conversion",
    "PyTorchJob",
    "conversion_warnings",
    "convert_pytorchjob",
    "converted_from",
    "is_pytorchjob",
    "load_resources",
]
