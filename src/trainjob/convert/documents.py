"""Reading manifests that may hold Kubeflow Training Operator v1 ``PyTorchJob`` documents next to TrainJobs and
runtimes: what ``trainjob apply -f``, ``render``, ``check`` and ``run -f`` read.

>>> [r.kind for r in load_resources('''
... apiVersion: kubeflow.org/v1
... kind: PyTorchJob
... metadata: {name: mnist}
... spec:
...   pytorchReplicaSpecs:
...     Master:
...       replicas: 1
...       template:
...         spec:
...           containers: [{name: pytorch, image: pytorch/pytorch, command: [torchrun, train.py]}]
... ''')]
['TrainJob']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from trainjob.api.io import (
    Resource,
    is_pytorchjob,
    read_documents,
    resource_from_dict,
    resources_from_documents,
)
from trainjob.convert.pytorchjob import convert_pytorchjob


def load_resources(source: str | Path | TextIO, *, name: str | None = None) -> list[Resource]:
    """:func:`trainjob.api.load_resources`, with every v1 ``PyTorchJob`` converted in place into its TrainJob (and,
    when the pod template holds more than ``spec.trainer`` can carry, the TrainingRuntime before it)."""
    return resources_from_documents(read_documents(source, name=name), _resources)


def _resources(document: Any) -> list[Resource]:
    if is_pytorchjob(document):
        return list(convert_pytorchjob(document).resources)
    return [resource_from_dict(document)]
