"""A container's environment and command line as the kubelet resolves them.

`container_env` walks `env` in order, as the kubelet does: a plain `value` with its
`$(VAR)` references expanded from the variables defined before it (`$$` is a literal
`$`, an unknown reference stays as written), `fieldRef` from the Pod as the API server
holds it (with status.podIP and status.hostIP the kubelet's own), `resourceFieldRef`
from the container's resources (a missing cpu or memory limit is the node's capacity,
as the kubelet reports it), `configMapKeyRef` from the ConfigMaps the caller fetched.
`expand` is the same `$(VAR)` expansion, for `command` and `args`. Anything else
(secretKeyRef, envFrom) raises `EnvError`: this kubelet does not pretend to give it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

Obj = dict[str, Any]
NODE_MEMORY = 8 * 1024**3  # the node's memory capacity, as this kubelet reports it
_REFERENCE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")
_QUANTITY = re.compile(r"([0-9.]+)(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?")
_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1), "m": Decimal("0.001"),
    **{s: Decimal(10) ** (3 * (i + 1)) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
    **{s: Decimal(2) ** (10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}  # fmt: skip
_LABEL_FIELD = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


class EnvError(ValueError):
    """A variable this kubelet cannot resolve (what and why, in one line)."""


def node_cpus() -> int:
    """The node's cpu capacity: this machine's cores."""
    return os.cpu_count() or 1


def expand(text: str, env: Mapping[str, str]) -> str:
    """`$(VAR)` replaced by `env[VAR]` when defined, `$$` by `$`, as Kubernetes expands."""

    def replace(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _REFERENCE.sub(replace, text)


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity ("100m", "128Mi", "2") as a number."""
    match = _QUANTITY.fullmatch(str(text))
    if match is None:
        raise EnvError(f"quantity {str(text)[:40]!r}: not a Kubernetes quantity")
    return Decimal(match[1]) * _SUFFIX[match[2] or ""]


def field_value(pod: Obj, path: str) -> str:
    """What the downward API gives for `path` (fieldRef.fieldPath) of `pod`."""
    labelled = _LABEL_FIELD.fullmatch(path)
    if labelled:
        return str(pod["metadata"].get(labelled[1], {}).get(labelled[2], ""))
    simple = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"].get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": pod.get("status", {}).get("podIP", ""),
        "status.hostIP": pod.get("status", {}).get("hostIP", ""),
    }
    if path not in simple:
        raise EnvError(f"fieldRef {path[:80]!r}: not a field this kubelet gives")
    return str(simple[path])


def resource_value(container: Obj, reference: Obj) -> str:
    """What the downward API gives for a resourceFieldRef of `container`."""
    name = reference["resource"]
    kind, _, resource = name.partition(".")
    if kind not in ("limits", "requests") or resource not in ("cpu", "memory"):
        raise EnvError(f"resourceFieldRef {name[:40]!r}: not a resource this kubelet gives")
    given = container.get("resources", {}).get(kind, {}).get(resource)
    if given is None and kind == "limits":
        value = Decimal(node_cpus() if resource == "cpu" else NODE_MEMORY)
    else:
        value = quantity(given) if given is not None else Decimal(0)
    divisor = quantity(reference.get("divisor") or "1")
    divisor = divisor if divisor > 0 else Decimal(1)
    return str(math.ceil(value / divisor))


def _one(item: Obj, pod: Obj, container: Obj, config_maps: Mapping[str, Obj]) -> str | None:
    """One env entry's value (None: an optional key that is absent, so no variable)."""
    if "value" in item or "valueFrom" not in item:
        return str(item.get("value", ""))
    source = item["valueFrom"]
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"])
    if "resourceFieldRef" in source:
        return resource_value(container, source["resourceFieldRef"])
    if "configMapKeyRef" in source:
        ref = source["configMapKeyRef"]
        data = config_maps.get(ref["name"], {}).get("data", {})
        if ref["key"] in data:
            return str(data[ref["key"]])
        if ref.get("optional"):
            return None
        raise EnvError(f"env {item['name']}: ConfigMap {ref['name']} has no key {ref['key']!r}")
    raise EnvError(f"env {item['name']}: valueFrom {sorted(source)} not given by this kubelet")


def container_env(
    container: Obj, pod: Obj, config_maps: Mapping[str, Obj], base: Mapping[str, str]
) -> dict[str, str]:
    """The container's variables over `base` (what the runtime sets: PATH), in order."""
    if container.get("envFrom"):
        raise EnvError(f"container {container['name']}: envFrom is not given by this kubelet")
    env = dict(base)
    for item in container.get("env", []):
        value = _one(item, pod, container, config_maps)
        if value is not None:
            env[item["name"]] = expand(value, env) if "value" in item else value
    return env


def config_map_names(container: Obj) -> set[str]:
    """The ConfigMaps the container's env reads."""
    return {
        item["valueFrom"]["configMapKeyRef"]["name"]
        for item in container.get("env", [])
        if "configMapKeyRef" in item.get("valueFrom", {})
    }
