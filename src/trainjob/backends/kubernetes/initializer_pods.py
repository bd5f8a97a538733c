"""A JobSet's initializer pods run trainjob's initializer (:mod:`trainjob.initializers`) where its runtime names
Kubeflow's images, and fail fast where retrying cannot help.

The operator's setting ``TRAINJOB_INITIALIZER_IMAGE`` (``trainjob install --initializer-image``, by default the
``--torch-image``: the training image of ``deploy/training.Dockerfile`` has the initializers in it) names the image.
In every replicated job, a container whose image is Kubeflow's ``.../dataset-initializer`` or
``.../model-initializer`` (any registry, tag or digest):

- gets that image, and, without a command, ``python -m trainjob.initializers dataset|model`` (Kubeflow's
  ``python -m pkg.initializers.dataset`` is rewritten to it); its env (``STORAGE_URI`` ...) is Kubeflow's contract;
- when the pod template sets no ``restartPolicy``, runs with ``Never``, and its Job gets a ``podFailurePolicy`` that
  fails it at once on :data:`~trainjob.initializers.__main__.REFUSED_EXIT_CODE` (a 403, a 404, bad credentials, an
  unknown scheme: the initializer has already retried what may pass), so the JobSet and the TrainJob fail within
  seconds with the initializer's termination message; a transfer that keeps breaking (exit 1) is retried by the
  Job's ``backoffLimit``.

Without the setting the images are left as the runtime names them (Kubeflow's own initializers then run).

Cluster-wide settings for every initializer (a Hub mirror in ``HF_ENDPOINT``, an S3 ``ENDPOINT``, proxies) are the
data of ConfigMap :data:`DEFAULTS_CONFIGMAP` in the operator's namespace (``trainjob install --initializer-env
HF_ENDPOINT=http://hub-mirror``, or edited in place: read whenever a job's JobSet is made); each key becomes an env
var of the initializer containers that do not set it themselves.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from trainjob.initializers.__main__ import REFUSED_EXIT_CODE
from trainjob.initializers.config import kubeflow_initializer_kind, kubeflow_module_to_ours

INITIALIZER_IMAGE_ENV = "TRAINJOB_INITIALIZER_IMAGE"
#: The ConfigMap (in the operator's namespace) whose data every initializer container gets as env.
DEFAULTS_CONFIGMAP = "trainjob-initializer-env"


def initializer_image(environ: dict[str, str] | None = None) -> str | None:
    """The operator's initializer image (``$TRAINJOB_INITIALIZER_IMAGE``), or ``None``."""
    return (os.environ if environ is None else environ).get(INITIALIZER_IMAGE_ENV) or None


def use_trainjob_initializers(jobset: dict[str, Any], image: str | None,
                              defaults: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None) -> list[str]:
    """Point ``jobset``'s Kubeflow initializer containers at trainjob's and give them ``defaults`` as env where
    they set none (see the module); the names of the replicated jobs changed. ``defaults`` may be a function,
    called only when the JobSet has an initializer (the operator reads a ConfigMap for it)."""
    changed = []
    settings: Mapping[str, str] | None = None if callable(defaults) else defaults
    for replicated in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        job_spec = (replicated.get("template") or {}).get("spec") or {}
        pod = (job_spec.get("template") or {}).get("spec") or {}
        names = []
        for container in pod.get("containers") or []:
            kind = kubeflow_initializer_kind(container.get("image") or "")
            if not kind:
                continue
            if settings is None and callable(defaults):
                settings = defaults()
            if settings:
                have = {e.get("name") for e in container.get("env") or []}
                container.setdefault("env", []).extend(
                    {"name": k, "value": v} for k, v in sorted(settings.items()) if k not in have)
            if not image:
                continue
            container["image"] = image
            if not [*(container.get("command") or []), *(container.get("args") or [])]:
                container["command"] = ["python", "-m", "trainjob.initializers", kind]
            else:
                container["command"] = kubeflow_module_to_ours(container.get("command") or [])
                if container.get("args"):
                    container["args"] = kubeflow_module_to_ours(container["args"])
            names.append(container["name"])
        if not names:
            continue
        changed.append(replicated["name"])
        if "restartPolicy" not in pod:
            pod["restartPolicy"] = "Never"
        if pod["restartPolicy"] == "Never" and "podFailurePolicy" not in job_spec:
            job_spec["podFailurePolicy"] = {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": name, "operator": "In",
                                                      "values": [REFUSED_EXIT_CODE]}}
                for name in names
            ]}
    return changed
