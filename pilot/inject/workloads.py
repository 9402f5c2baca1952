"""Pod templates inside workload objects, for `pilot kube-inject` (istioctl's).

Deployments, StatefulSets, DaemonSets, ReplicaSets and Jobs carry theirs at
`spec.template`, CronJobs at `spec.jobTemplate.spec.template`; a Pod is its own;
a List's items are each of these. Any other kind is returned unchanged. The same
decision and template as the webhook: a template the decision leaves alone is left
alone, and the workload itself (kind, apiVersion, name) is the sidecar's owner.
"""

from __future__ import annotations

import copy
from typing import Any

from pilot.inject.decision import injection_required
from pilot.inject.errors import InjectError
from pilot.inject.pod import inject
from pilot.inject.settings import InjectSettings
from pilot.inject.shape import mapping, objects, text

TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


class ObjectError(InjectError):
    """An object that cannot be injected; `label` names it (kind and name, List item)."""

    def __init__(self, label: str, message: str) -> None:
        super().__init__(message)
        self.label = label


def label(obj: dict[str, Any]) -> str:
    """`Kind name` of an object, for an error line (repr-escaped when not plain)."""
    kind, name = obj.get("kind"), mapping_or_empty(obj.get("metadata")).get("name")
    parts = [
        value
        if isinstance(value, str) and value.isprintable() and len(value) <= 253
        else repr(value)[:60]
        for value in (kind, name)
        if value is not None
    ]
    return " ".join(parts) or "object without kind or name"


def mapping_or_empty(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def inject_object(obj: Any, settings: InjectSettings, namespace: str) -> Any:
    """`obj` with its pod template(s) injected (a new object); ObjectError when one
    cannot be. `namespace` is the one for objects that name none."""
    if not isinstance(obj, dict):
        raise ObjectError(type(obj).__name__, "not a Kubernetes object")
    try:
        return _inject(obj, settings, namespace)
    except ObjectError:
        raise
    except InjectError as error:
        raise ObjectError(label(obj), str(error)) from None


def _inject(obj: dict[str, Any], settings: InjectSettings, namespace: str) -> dict[str, Any]:
    kind = obj.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and "items" in obj:
        items = objects(obj, "items", "items")
        injected = [_item(item, index, settings, namespace) for index, item in enumerate(items)]
        return {**obj, "items": injected}
    metadata = mapping(obj, "metadata", "metadata")
    where = text(metadata, "namespace", "metadata.namespace") or namespace
    if kind == "Pod":
        if not injection_required(obj, where, settings)[0]:
            return copy.deepcopy(obj)
        return inject(obj, settings, namespace=where)
    path = TEMPLATE_PATHS.get(kind) if isinstance(kind, str) else None
    if path is None:
        return copy.deepcopy(obj)
    new = copy.deepcopy(obj)
    parent = new
    for depth, key in enumerate(path[:-1]):
        parent = mapping(parent, key, ".".join(path[: depth + 1]))
    template = mapping(parent, path[-1], ".".join(path))
    if not injection_required(template, where, settings)[0]:
        return new
    owner = {
        "kind": kind,
        "apiVersion": text(obj, "apiVersion", "apiVersion"),
        "name": text(metadata, "name", "metadata.name"),
    }
    parent[path[-1]] = inject(template, settings, namespace=where, owner=owner)
    return new


def _item(item: dict[str, Any], index: int, settings: InjectSettings, namespace: str) -> Any:
    try:
        return _inject(item, settings, namespace)
    except ObjectError as error:
        raise ObjectError(f"item {index} ({error.label})", str(error)) from None
    except InjectError as error:
        raise ObjectError(f"item {index} ({label(item)})", str(error)) from None
