"""What a TrainJob's annotations say of where it came from: a Kubeflow v1 ``PyTorchJob`` it was converted from
(:mod:`trainjob.convert.pytorchjob` writes these annotations; reading them needs nothing of the conversion)."""

from __future__ import annotations

from trainjob.constants import CONVERSION_WARNINGS_ANNOTATION, CONVERTED_FROM_ANNOTATION


def converted_from(annotations: dict[str, str] | None) -> str | None:
    """``kubeflow.org/v1 PyTorchJob`` when the annotations mark a converted TrainJob, else ``None``."""
    return (annotations or {}).get(CONVERTED_FROM_ANNOTATION)


def conversion_warnings(annotations: dict[str, str] | None) -> list[str]:
    """The warnings a converted TrainJob carries (annotation ``trainjob/conversion-warnings``)."""
    text = (annotations or {}).get(CONVERSION_WARNINGS_ANNOTATION, "")
    return [line for line in text.splitlines() if line]
