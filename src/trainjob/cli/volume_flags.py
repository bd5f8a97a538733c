"""The volume flags of ``trainjob run`` / ``apply`` / ``arena submit``: ``--data`` and ``--config-map``.

``--data CLAIM:/path`` (arena's flag; ``CLAIM:/path:ro`` read-only) becomes a ``podTemplateOverrides`` entry that
mounts the claim in the trainer's ``node`` container, the same on both backends; ``--config-map NAME=PATH`` gives a
local job the content of a ``configMap`` volume (:mod:`trainjob.backends.local.volumes` says how either is seen by
the processes)::

    data_overrides(["imagenet:/data:ro"])          # [{"targetJobs": [{"name": "node"}], "spec": {...}}]
    parse_config_maps(["settings=./conf.yaml"])    # {"settings": Path("/home/me/project/conf.yaml")}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainjob.constants import TRAINER_CONTAINER, TRAINER_JOB
from trainjob.errors import ValidationError


def data_overrides(volumes: tuple[str, ...] | list[str], flag: str = "--data") -> list[dict[str, Any]]:
    """``podTemplateOverrides`` mounting each ``CLAIM:/path`` (``CLAIM:/path:ro`` read-only) in the trainer's
    ``node`` container, as arena's ``--data``."""
    mounts, claims = [], []
    for index, value in enumerate(volumes):
        claim, sep, path = value.partition(":")
        read_only = False
        if path.endswith(":ro") or path.endswith(":rw"):
            path, read_only = path[:-3], path.endswith(":ro")
        if not sep or not claim or not path.startswith("/"):
            raise ValidationError(flag, f"must be PVC_NAME:/mount/path (or PVC_NAME:/mount/path:ro), got {value!r}")
        claims.append({"name": f"data-{index}", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": f"data-{index}", "mountPath": path, **({"readOnly": True} if read_only else {})})
    if not claims:
        return []
    return [{"targetJobs": [{"name": TRAINER_JOB}],
             "spec": {"volumes": claims, "containers": [{"name": TRAINER_CONTAINER, "volumeMounts": mounts}]}}]


def parse_config_maps(values: tuple[str, ...] | list[str], flag: str = "--config-map") -> dict[str, Path]:
    """``NAME=PATH`` pairs as ``{NAME: absolute path}``; the path must exist."""
    out: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ValidationError(flag, f"must be NAME=PATH (a file or directory), got {value!r}")
        resolved = Path(path).expanduser().resolve()
        if not resolved.exists():
            raise ValidationError(flag, f"{path} (configMap {name}) does not exist")
        out[name] = resolved
    return out
