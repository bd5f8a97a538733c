"""What the kubelet works out from a pod before starting it: environment, command, volumes, host names.

Pure functions over the pod as a dict, so they are easy to test and the node agent stays about processes::

    env = container_env(pod, container, lookup)      # literal values, $(VAR), downward API, config maps, secrets
    argv = container_argv(container, env)            # command + args with $(VAR) expanded
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import ROUND_CEILING, Decimal
from typing import Any

# A pod's own name lookup: (kind, namespace, name) -> the object's data dict, or None when it does not exist.
Lookup = Callable[[str, str, str], dict[str, str] | None]

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}


class PodConfigError(Exception):
    """The pod cannot start as written (a missing config map key, an unknown field path); the kubelet's
    ``CreateContainerConfigError``."""


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known names are replaced, unknown ones kept, ``$$`` escapes."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REF.sub(sub, text)


def quantity(text: str) -> Decimal:
    match = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)", str(text).strip())
    if not match or match.group(2) not in _SUFFIXES:
        raise PodConfigError(f"not a quantity: {text!r}")
    return Decimal(match.group(1)) * Decimal(_SUFFIXES[match.group(2)])


def field_value(pod: dict[str, Any], path: str) -> str:
    """``fieldRef.fieldPath`` as the kubelet resolves it."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
    }
    if path not in simple:
        raise PodConfigError(f"unsupported fieldRef.fieldPath {path!r}")
    return str(simple[path] or "")


def resource_value(container: dict[str, Any], ref: dict[str, Any]) -> str:
    """``resourceFieldRef``: a request or limit in units of ``divisor``, rounded up as the kubelet does."""
    kind, _, resource = ref["resource"].partition(".")
    resources = (container.get("resources") or {}).get(kind) or {}
    raw = resources.get(resource)
    if raw is None:  # an unset limit reads as the node's allocatable; requests as 0
        return "0" if kind == "requests" else str(2**31 - 1)
    value = quantity(str(raw)) / quantity(str(ref.get("divisor") or "1"))
    return str(int(value.to_integral_value(rounding=ROUND_CEILING)))


def container_env(pod: dict[str, Any], container: dict[str, Any], lookup: Lookup) -> dict[str, str]:
    """The container's environment: ``envFrom`` first, then ``env`` in order (later ones see earlier ones)."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key in source:
                data = lookup(kind, namespace, source[key]["name"])
                if data is None and not source[key].get("optional"):
                    raise PodConfigError(f"{kind.lower()} {source[key]['name']!r} not found")
                env.update({source.get("prefix", "") + k: v for k, v in (data or {}).items()})
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(str(var.get("value", "")), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = resource_value(container, source["resourceFieldRef"])
        else:
            kind, key = ("ConfigMap", "configMapKeyRef") if "configMapKeyRef" in source else ("Secret", "secretKeyRef")
            ref = source.get(key)
            if ref is None:
                raise PodConfigError(f"env {name}: unsupported valueFrom {sorted(source)}")
            data = lookup(kind, namespace, ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise PodConfigError(f"env {name}: {kind.lower()} {ref['name']!r} has no key {ref['key']!r}")
            env[name] = data[ref["key"]]
    return env


def container_argv(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded; there is no image, so a command is required."""
    command = [expand(str(a), env) for a in container.get("command") or []]
    args = [expand(str(a), env) for a in container.get("args") or []]
    if not command:
        raise PodConfigError(
            f"container {container['name']!r} has no command: images are not run on this node, so the "
            "entrypoint must be given as `command`"
        )
    return command + args


def pod_hostname(pod: dict[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"])[:63]


def pod_host_names(pod: dict[str, Any]) -> list[str]:
    """The names other pods resolve this pod by: ``{hostname}.{subdomain}[.{ns}.svc[.cluster.local]]``."""
    hostname = pod_hostname(pod)
    subdomain = (pod.get("spec") or {}).get("subdomain")
    if not subdomain:
        return [hostname]
    namespace = pod["metadata"]["namespace"]
    fqdn = f"{hostname}.{subdomain}.{namespace}.svc"
    return [f"{fqdn}.cluster.local", fqdn, f"{hostname}.{subdomain}", hostname]
