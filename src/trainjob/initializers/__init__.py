"""Dataset and model initializers: a job's data and model fetched before its nodes start, as Kubeflow Trainer's
``dataset-initializer`` and ``model-initializer`` steps do, from the same environment.

``python -m trainjob.initializers dataset|model`` runs one (:mod:`.__main__`): in a runtime's initializer pod on
Kubernetes, and as a process before the nodes on this machine. What it reads is in :mod:`.config`; how a run goes
(list, reuse or download, verify, put in place) in :mod:`.run`; the sources are :mod:`.huggingface` (``hf://``)
and :mod:`.s3` (``s3://``); the cache shared by jobs is :mod:`.cache`.

>>> from trainjob.initializers import InitializerConfig
>>> InitializerConfig.from_env("dataset", {"STORAGE_URI": "hf://tatsu-lab/alpaca"}).target
'/workspace/dataset'
"""

from __future__ import annotations

from trainjob.initializers.config import InitializerConfig, parse_storage_uri

__all__ = ["InitializerConfig", "parse_storage_uri"]
