"""The parts of a runtime's job templates that trainjob reads or changes, checked once when the runtime is read.

A replicated job's ``template`` is a ``batch/v1`` JobTemplateSpec kept as a plain dict, so that rendering loses
no field. :func:`check_job_template` holds it to the shapes below before anything uses it, so that resolving
and rendering never meet a string where a mapping belongs, a port without ``containerPort`` or a label that
is a list. Fields not listed here are kept as they are; ``null`` fields are dropped, as Kubernetes does when it
decodes a typed object.

================================  ==============================================================
where                             checked
================================  ==============================================================
``metadata`` (job and pod)        ``labels`` and ``annotations``: string to string
``spec``                          ``parallelism``, ``completions``: int32 >= 0;
                                  ``activeDeadlineSeconds``: int64 >= 1
``spec.template.spec``            ``containers``, ``initContainers`` (unique names), ``volumes``,
                                  ``schedulingGates`` (each named), ``tolerations``,
                                  ``imagePullSecrets`` (mappings), ``nodeSelector`` (string to
                                  string), ``affinity`` (a mapping), ``serviceAccountName``,
                                  ``schedulerName``, ``restartPolicy`` (strings)
containers                        ``name``, ``image``, ``command``/``args`` (strings), ``env``,
                                  ``envFrom``, ``ports`` (``containerPort`` 1..65535),
                                  ``resources`` (quantities), ``volumeMounts`` (name and path)
================================  ==============================================================

>>> check_job_template({"spec": {"template": {"spec": {"containers": [{"name": "node", "ports": [{}]}]}}}})
Traceback (most recent call last):
...
trainjob.errors.ValidationError: spec.template.spec.containers[0].ports[0].containerPort: required field is missing
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from trainjob.api.common import EnvVar, Int32, Int64, KubeModel, ResourceRequirements
from trainjob.api.errors import shorten, validate_model

Port = Annotated[int, Field(ge=1, le=65535)]


class _Open(KubeModel):
    """A Kubernetes object of which only some fields are checked; the others are kept as they are."""

    model_config = ConfigDict(extra="allow")


class TemplateMetadata(_Open):
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class ContainerPort(KubeModel):
    container_port: Port
    name: str | None = None
    protocol: Literal["TCP", "UDP", "SCTP"] | None = None
    host_port: Annotated[int, Field(ge=0, le=65535)] | None = None
    host_ip: str | None = None


class VolumeMount(_Open):
    name: str
    mount_path: str


class Named(_Open):
    """A volume or scheduling gate: anything with a required ``name``."""

    name: str


class Container(_Open):
    name: Annotated[str, Field(min_length=1)]
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    working_dir: str | None = None
    env: list[EnvVar] | None = None
    env_from: list[dict[str, Any]] | None = None
    ports: list[ContainerPort] | None = None
    resources: ResourceRequirements | None = None
    volume_mounts: list[VolumeMount] | None = None


class PodSpec(_Open):
    containers: list[Container] | None = None
    init_containers: list[Container] | None = None
    volumes: list[Named] | None = None
    scheduling_gates: list[Named] | None = None
    tolerations: list[dict[str, Any]] | None = None
    image_pull_secrets: list[dict[str, Any]] | None = None
    node_selector: dict[str, str] | None = None
    affinity: dict[str, Any] | None = None
    service_account_name: str | None = None
    scheduler_name: str | None = None
    restart_policy: str | None = None

    @model_validator(mode="after")
    def _unique_container_names(self) -> Self:
        counts = Counter(c.name for c in [*(self.init_containers or []), *(self.containers or [])])
        twice = sorted(name for name, count in counts.items() if count > 1)
        if twice:
            raise ValueError(
                "container names (initContainers included) must be unique in a pod, "
                f"got {shorten(', '.join(twice))} more than once"
            )
        return self


class PodTemplate(_Open):
    metadata: TemplateMetadata | None = None
    spec: PodSpec | None = None


class JobSpec(_Open):
    parallelism: Annotated[Int32, Field(ge=0)] | None = None
    completions: Annotated[Int32, Field(ge=0)] | None = None
    active_deadline_seconds: Annotated[Int64, Field(ge=1)] | None = None
    template: PodTemplate | None = None


class JobTemplate(_Open):
    """``batch/v1`` JobTemplateSpec."""

    metadata: TemplateMetadata | None = None
    spec: JobSpec | None = None


def check_job_template(template: dict[str, Any]) -> dict[str, Any]:
    """``template`` without its ``null`` fields, once it fits the shapes above; else :class:`~trainjob.errors.ValidationError`
    with paths inside the template (``spec.template.spec.containers[0].name``)."""
    validate_model(JobTemplate, template)
    return _without_nulls(template)


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
