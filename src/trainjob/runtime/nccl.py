"""NCCL profiles (named sets of ``NCCL_*`` variables from the seeds) and the NCCL set-up mistakes worth a warning.

A profile is chosen with the annotation ``trainjob/nccl-profile`` on the TrainJob or its runtime (the job's
wins; several names, ``roce,debug``, apply in order) or with :func:`apply_nccl_profile` (``trainjob run
--nccl-profile``). Its variables go into the trainer's env when the job is resolved; a variable the job or runtime
sets itself is left as it is.

=========  =====================================================================================================
profile    variables
=========  =====================================================================================================
``ib``     InfiniBand: ``NCCL_IB_DISABLE=0``, ``NCCL_IB_HCA=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1``,
           ``NCCL_NET_GDR_LEVEL=5`` (GPU Direct RDMA), ``NCCL_IB_TIMEOUT=22``, ``NCCL_DEBUG=WARN``
``roce``   ``ib`` plus RoCE v2: ``NCCL_IB_GID_INDEX=3``, ``NCCL_IB_TC=106`` (traffic class),
           ``NCCL_SOCKET_IFNAME=eth0`` (bootstrap)
``tcp``    sockets only: ``NCCL_IB_DISABLE=1``, ``NCCL_SOCKET_IFNAME=eth0``, ``NCCL_NSOCKS_PERTHREAD=8``,
           ``NCCL_SOCKET_NTHREADS=8``, ``NCCL_DEBUG=WARN``
``debug``  ``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=ALL``
=========  =====================================================================================================

Findings (:func:`nccl_findings`, shown by ``trainjob check job.yaml`` and as events when a job is submitted):

=====  ============================  =========================================================================
TJ015  nccl-env-on-cpu-job           ``NCCL_*`` variables on a job that requests no GPU: it uses gloo, NCCL never
                                     reads them
TJ016  ib-disabled-with-rdma         ``NCCL_IB_DISABLE=1`` while RDMA devices are requested (``rdma/*``,
                                     ``*/hca*``): the job pays for InfiniBand/RoCE and talks over TCP
TJ017  no-dev-shm-on-multi-gpu       more than one GPU per node and no ``emptyDir: {medium: Memory}`` volume at
                                     ``/dev/shm``: a container's 64 MiB default makes NCCL fail or fall back
=====  ============================  =========================================================================

>>> sorted(PROFILES)
['debug', 'ib', 'roce', 'tcp']
>>> profile_env("tcp,debug")["NCCL_DEBUG"]
'INFO'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainjob.api import TrainJob
from trainjob.api.quantity import gpu_count
from trainjob.constants import NCCL_PROFILE_ANNOTATION
from trainjob.errors import ValidationError
from trainjob.runtime.plan import Container, EnvVar, Plan
from trainjob.runtime.template import upsert_env

SHM_PATH = "/dev/shm"

_IB = {
    "NCCL_IB_DISABLE": "0",
    "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
    "NCCL_NET_GDR_LEVEL": "5",
    "NCCL_IB_TIMEOUT": "22",
    "NCCL_DEBUG": "WARN",
}
#: Profile name -> the variables it sets.
PROFILES: dict[str, dict[str, str]] = {
    "ib": _IB,
    "roce": {**_IB, "NCCL_IB_GID_INDEX": "3", "NCCL_IB_TC": "106", "NCCL_SOCKET_IFNAME": "eth0"},
    "tcp": {
        "NCCL_IB_DISABLE": "1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_NSOCKS_PERTHREAD": "8",
        "NCCL_SOCKET_NTHREADS": "8",
        "NCCL_DEBUG": "WARN",
    },
    "debug": {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ALL"},
}
_RDMA_RESOURCE = re.compile(r"(rdma/.+|[^/]+/.*hca.*)", re.IGNORECASE)


def profile_names(value: str, field: str = NCCL_PROFILE_ANNOTATION) -> list[str]:
    """The profile names in ``value`` (comma-separated); :class:`ValidationError` on ``field`` for unknown ones."""
    names = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [name for name in names if name not in PROFILES]
    if unknown or not names:
        raise ValidationError(
            field, f"unknown NCCL profile {unknown[0] if unknown else value!r}; profiles: {', '.join(sorted(PROFILES))} "
            "(several: roce,debug)"
        )
    return names


def profile_env(value: str, field: str = NCCL_PROFILE_ANNOTATION) -> dict[str, str]:
    """The variables of the profiles in ``value``, later profiles winning."""
    env: dict[str, str] = {}
    for name in profile_names(value, field):
        env.update(PROFILES[name])
    return env


def apply_nccl_profile(trainjob: TrainJob, name: str) -> TrainJob:
    """A copy of ``trainjob`` whose trainer env has the profile's variables (those it sets itself are kept) and
    whose annotation ``trainjob/nccl-profile`` names it; for ``trainjob run --nccl-profile NAME``.

    The variables are written into ``spec.trainer.env``, so the job runs the same on a cluster without trainjob.
    """
    env = profile_env(name, "--nccl-profile")
    data = trainjob.to_dict()
    trainer = data["spec"].setdefault("trainer", {})
    existing = {var["name"] for var in trainer.get("env") or []}
    trainer["env"] = [*(trainer.get("env") or []), *({"name": k, "value": v} for k, v in env.items() if k not in existing)]
    metadata = data["metadata"]
    metadata["annotations"] = {**(metadata.get("annotations") or {}), NCCL_PROFILE_ANNOTATION: name}
    return TrainJob.from_dict(data)


def apply_profile_annotation(container: Container, *annotation_sets: Mapping[str, str] | None) -> None:
    """Add the variables of the first ``trainjob/nccl-profile`` annotation found (the job's, then the runtime's)
    that ``container`` does not set already."""
    for found in annotation_sets:
        value = (found or {}).get(NCCL_PROFILE_ANNOTATION)
        if value is None:
            continue
        field = f"metadata.annotations[{NCCL_PROFILE_ANNOTATION}]"
        present = {var.name for var in container.env}
        upsert_env(container, [EnvVar(k, v) for k, v in profile_env(value, field).items() if k not in present])
        return


@dataclass(frozen=True)
class NcclFinding:
    """One NCCL set-up problem of a resolved job, with what to do about it."""

    rule: str
    name: str
    severity: str
    message: str
    fix: str
    #: The env variable or resource the finding is about (to point at it in a file).
    subject: str


def nccl_findings(plan: Plan) -> list[NcclFinding]:
    """The NCCL findings (table in the module docstring) for the trainer of a resolved job."""
    trainer = plan.trainer()
    container = trainer.container()
    env = container.env_dict()
    resources = container.resources.effective()
    gpus = gpu_count(resources)
    findings = []
    nccl_vars = sorted(name for name in env if name.startswith("NCCL_"))
    if nccl_vars and gpus == 0:
        findings.append(NcclFinding(
            "TJ015", "nccl-env-on-cpu-job", "warning",
            f"{', '.join(nccl_vars)} set but the job requests no GPU: it communicates with gloo and NCCL never "
            "reads them",
            "request GPUs (resourcesPerNode nvidia.com/gpu) if the job should use NCCL, else drop the NCCL_* "
            "variables (and the nccl profile)",
            nccl_vars[0],
        ))
    rdma = sorted(name for name in resources if _RDMA_RESOURCE.fullmatch(name))
    if env.get("NCCL_IB_DISABLE", "").strip() == "1" and rdma:
        findings.append(NcclFinding(
            "TJ016", "ib-disabled-with-rdma", "warning",
            f"NCCL_IB_DISABLE=1 while {', '.join(rdma)} is requested: NCCL talks over TCP sockets and the RDMA "
            "device sits unused",
            "set NCCL_IB_DISABLE=0 (nccl profile ib or roce), or stop requesting the RDMA device",
            "NCCL_IB_DISABLE",
        ))
    if gpus > 1 and not _has_memory_shm(trainer.template, container):
        findings.append(NcclFinding(
            "TJ017", "no-dev-shm-on-multi-gpu", "error",
            f"{gpus} GPUs per node and no memory-backed /dev/shm: NCCL's shared-memory transport between local "
            "ranks runs out of the container's 64 MiB default",
            "add volume {name: shm, emptyDir: {medium: Memory, sizeLimit: 16Gi}} and mount it at /dev/shm in the "
            "trainer container",
            next(name for name in resources if gpu_count({name: resources[name]}) > 0),
        ))
    return findings


def _has_memory_shm(template: dict[str, Any], container: Container) -> bool:
    pod = ((template.get("spec") or {}).get("template") or {}).get("spec") or {}
    memory_volumes = {
        volume.get("name")
        for volume in pod.get("volumes") or []
        if ((volume.get("emptyDir") or {}).get("medium")) == "Memory"
    }
    return any(
        mount.get("mountPath", "").rstrip("/") == SHM_PATH and mount.get("name") in memory_volumes
        for mount in container.volume_mounts
    )
