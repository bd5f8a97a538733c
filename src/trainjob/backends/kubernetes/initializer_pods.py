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
"""

from __future__ import annotations

import os
from typing import Any

from trainjob.initializers.__main__ import REFUSED_EXIT_CODE
from trainjob.initializers.config import kubeflow_initializer_kind, kubeflow_module_to_ours

INITIALIZER_IMAGE_ENV = "TRAINJOB_INITIALIZER_IMAGE"


def initializer_image(environ: dict[str, str] | None = None) -> str | None:
    """The operator's initializer image (``$TRAINJOB_INITIALIZER_IMAGE``), or ``None``."""
    return (os.environ if environ is None else environ).get(INITIALIZER_IMAGE_ENV) or None


def use_trainjob_initializers(jobset: dict[str, Any], image: str | None) -> list[str]:
    """Point ``jobset``'s Kubeflow initializer containers at trainjob's (see the module); the names of the
    replicated jobs changed."""
    if not image:
        return []
    changed = []
    for replicated in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        job_spec = (replicated.get("template") or {}).get("spec") or {}
        pod = (job_spec.get("template") or {}).get("spec") or {}
        names = []
        for container in pod.get("containers") or []:
            kind = kubeflow_initializer_kind(container.get("image") or "")
            if not kind:
                continue
            container["image"] = image
            command = [*(container.get("command") or []), *(container.get("args") or [])]
            if not command:
                container["command"] = ["python", "-m", "trainjob.initializers", kind]
            else:
                container["command"] = kubeflow_module_to_ours(container.get("command") or [])
                container["args"] = kubeflow_module_to_ours(container.get("args") or [])
                if not container["args"]:
                    del container["args"]
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
