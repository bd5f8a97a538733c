"""Building blocks shared by every resource: the model base, object metadata, env vars, resources, conditions.

Attributes are snake_case in Python and camelCase in YAML (``num_nodes`` / ``numNodes``). Models are strict
like the Kubernetes API server: ``numNodes: "4"`` is rejected (it must be an integer) and so is any unknown field.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema, field_validator
from pydantic.alias_generators import to_camel

from trainjob.api.errors import quote, validate_model
from trainjob.api.quantity import Quantity, QuantityError, parse_quantity
from trainjob.constants import (
    API_GROUP as API_GROUP,  # re-exported: API modules and users import them from here
)
from trainjob.constants import API_VERSION as API_VERSION

#: Most trainer nodes of one job. Kubernetes supports clusters of up to 5,000 nodes; a trainer pod usually
#: takes a whole node, so 10,000 leaves room while every per-node table (node ranks, the local backend's node
#: processes) stays small. A larger ``numNodes`` or ``maxNodes`` is refused, not clamped.
MAX_NUM_NODES = 10_000
#: Most processes per node: the largest machines have a few hundred cores and 8 to 16 GPUs.
MAX_NUM_PROC_PER_NODE = 1_024

#: Kubernetes ``int32`` and ``int64`` fields.
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
#: A node count: ``numNodes``, ``minNodes``, ``maxNodes``.
NumNodes = Annotated[int, Field(ge=1, le=MAX_NUM_NODES)]

# fullmatch, not match with ``$``: ``$`` also matches before a trailing newline, so "abc\n" would pass.
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_RFC1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class KubeModel(BaseModel):
    """Base of every API model: camelCase aliases, strict types, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        validate_assignment=True,
        defer_build=True,
    )

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        """Validate a Kubernetes-shaped dict; raises :class:`trainjob.errors.ValidationError` with field paths.

        >>> ResourceRequirements.from_dict({"requests": {"cpu": "2"}}).requests
        {'cpu': '2'}
        """
        return validate_model(cls, data)

    def to_dict(self) -> dict[str, Any]:
        """The Kubernetes-shaped dict: camelCase keys, no ``None`` fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _validate_quantity(value: Any) -> Quantity:
    try:
        parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    return value


def _validate_resource_quantity(value: Any) -> Quantity:
    if parse_quantity(_validate_quantity(value)) < 0:
        raise ValueError(f"must not be negative, got {quote(value)}")
    return value


#: A resource quantity kept as written (``8``, ``"16Gi"``) after checking that it parses.
QuantityValue = Annotated[
    int | float | str,
    PlainValidator(_validate_quantity),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}]}),
]
#: An amount of a resource in ``requests`` or ``limits``: a quantity >= 0, as Kubernetes requires.
ResourceQuantity = Annotated[
    int | float | str,
    PlainValidator(_validate_resource_quantity),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}]}),
]


def validate_dns_label(name: str) -> str:
    """RFC 1035 label, as Kubernetes requires for TrainJob names (they become DNS names of the pods)."""
    if len(name) > 63:
        raise ValueError(f"must be at most 63 characters, got {len(name)} ({quote(name)})")
    if not _DNS_LABEL.fullmatch(name):
        raise ValueError(
            f"must be a DNS label (lowercase letters, digits and '-', starting with a letter), got {quote(name)}"
        )
    return name


def validate_dns_subdomain(name: str) -> str:
    """RFC 1123 subdomain, the rule for names of most Kubernetes objects."""
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise ValueError(f"must be a DNS subdomain (lowercase letters, digits, '-' and '.'), got {quote(name)}")
    return name


def validate_namespace(name: str) -> str:
    """RFC 1123 label (at most 63 characters), the rule for namespace names."""
    if len(name) > 63 or not _RFC1123_LABEL.fullmatch(name):
        raise ValueError(
            f"must be a namespace name (at most 63 lowercase letters, digits and '-'), got {quote(name)}"
        )
    return name


class ObjectMeta(KubeModel):
    """``metadata`` of a resource; ``namespace`` is filled with ``default`` for namespaced kinds."""

    name: str
    namespace: str | None = None
    generate_name: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: Int64 | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: Int64 | None = None
    finalizers: list[str] | None = None
    owner_references: list[dict[str, Any]] | None = None
    managed_fields: list[dict[str, Any]] | None = None
    self_link: str | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        return validate_dns_subdomain(name)

    @field_validator("namespace")
    @classmethod
    def _valid_namespace(cls, namespace: str | None) -> str | None:
        return namespace if namespace is None else validate_namespace(namespace)


class NamespacedObjectMeta(ObjectMeta):
    """Metadata of a namespaced resource: ``namespace`` defaults to ``default``."""

    namespace: str = "default"


class KubeResource(KubeModel):
    """A top-level resource: ``apiVersion``, ``kind``, ``metadata`` (subclasses narrow ``kind`` and ``metadata``)."""

    api_version: Literal["trainer.kubeflow.org/v1alpha1"] = API_VERSION
    kind: str
    metadata: ObjectMeta

    @property
    def name(self) -> str:
        return self.metadata.name


class KeyRef(KubeModel):
    """``configMapKeyRef`` / ``secretKeyRef``."""

    key: str
    name: str = ""
    optional: bool | None = None


class FieldRef(KubeModel):
    field_path: str
    api_version: str | None = None


class ResourceFieldRef(KubeModel):
    resource: str
    container_name: str | None = None
    divisor: QuantityValue | None = None


class FileKeyRef(KubeModel):
    key: str
    path: str
    volume_name: str
    optional: bool | None = None


class EnvVarSource(KubeModel):
    config_map_key_ref: KeyRef | None = None
    field_ref: FieldRef | None = None
    file_key_ref: FileKeyRef | None = None
    resource_field_ref: ResourceFieldRef | None = None
    secret_key_ref: KeyRef | None = None


class EnvVar(KubeModel):
    """A container environment variable: ``value`` or ``valueFrom``."""

    name: Annotated[str, Field(min_length=1)]
    value: str | None = None
    value_from: EnvVarSource | None = None


class ResourceClaim(KubeModel):
    name: str
    request: str | None = None


class ResourceRequirements(KubeModel):
    """Requests and limits per resource name (``cpu``, ``memory``, ``nvidia.com/gpu`` ...), none negative."""

    limits: dict[str, ResourceQuantity] | None = None
    requests: dict[str, ResourceQuantity] | None = None
    claims: list[ResourceClaim] | None = None


class LocalObjectReference(KubeModel):
    name: str = ""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


ConditionStatus = Annotated[str, Field(pattern=r"^(True|False|Unknown)$")]


class Condition(KubeModel):
    """A status condition (``Created``, ``Suspended``, ``Complete``, ``Failed`` ...).

    >>> Condition(type="Complete", status="True", reason="JobsCompleted").status
    'True'
    """

    type: str
    status: ConditionStatus
    reason: Annotated[str, Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")] = "Unknown"
    message: str = ""
    last_transition_time: str = Field(default_factory=_now)
    observed_generation: Annotated[Int64, Field(ge=0)] | None = None


NUM_PROC_PER_NODE_KEYWORDS = ("auto", "cpu", "gpu")


def _validate_num_proc_per_node(value: Any) -> int | str:
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value.strip()):
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        if value > MAX_NUM_PROC_PER_NODE:
            raise ValueError(f"must be at most {MAX_NUM_PROC_PER_NODE} processes per node, got {quote(value)}")
        return value
    if isinstance(value, str) and value in NUM_PROC_PER_NODE_KEYWORDS:
        return value
    raise ValueError(f"must be auto, cpu, gpu or an integer >= 1, got {quote(value)}")


#: ``numProcPerNode``: ``auto``, ``cpu``, ``gpu`` or an integer from 1 to :data:`MAX_NUM_PROC_PER_NODE`
#: (``"8"`` is read as 8).
NumProcPerNode = Annotated[
    int | str,
    PlainValidator(_validate_num_proc_per_node),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_NUM_PROC_PER_NODE},
                {"enum": list(NUM_PROC_PER_NODE_KEYWORDS)},
            ]
        }
    ),
]
