"""The object store behind the test API server ("etcd + watch cache").

Owns the objects, the single global resourceVersion counter, per-resource-type
event history with compaction, reconstruction of the state at an older
resourceVersion (for consistent paged lists), and the errors (`ApiError`) that
become `Status` objects on the wire. Pure and synchronous: no I/O, no asyncio.
Stored objects are never mutated in place; callers get deep copies.
"""

from __future__ import annotations

import copy
import secrets
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .resources import ResourceType

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace is "" for cluster-scoped objects


class ApiError(Exception):
    """An API failure; `status()` is the `Status` object kube-apiserver would send."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}  # sent with the Status (Retry-After)

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def not_found(rt: ResourceType, name: str) -> ApiError:
    details = {"name": name, "group": rt.group, "kind": rt.plural}
    return ApiError(404, "NotFound", f'{_resource_name(rt)} "{name}" not found', details)


def expired(requested: int, oldest: int) -> ApiError:
    return ApiError(410, "Expired", f"too old resource version: {requested} ({oldest})")


def too_large(requested: int, current: int) -> ApiError:
    details = {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }
    message = f"Too large resource version: {requested}, current: {current}"
    return ApiError(504, "Timeout", message, details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _resource_name(rt: ResourceType) -> str:
    return f"{rt.plural}.{rt.group}" if rt.group else rt.plural


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Event:
    """One change: `obj` is the new state (for DELETED the last state stamped with
    the deletion's resourceVersion), `prev` the state before (None for ADDED)."""

    type: str
    rtype: ResourceType
    rv: int
    obj: Obj
    prev: Obj | None


def object_key(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def with_rv(obj: Obj, rv: int) -> Obj:
    """A shallow-copied object whose metadata.resourceVersion is rv."""
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}


class Store:
    """Objects per resource type, one global resourceVersion, bounded history."""

    def __init__(self, history_limit: int = 100_000, initial_rv: int = 1000) -> None:
        self.rv = initial_rv
        self.compacted_rv = initial_rv
        self.history_limit = history_limit
        self._objects: dict[ResourceType, dict[Key, Obj]] = {}
        self._history: dict[ResourceType, deque[Event]] = {}
        self._floor: dict[ResourceType, int] = {}
        self._cluster_ips = 0
        self.listeners: list[Callable[[Event], None]] = []

    # ----------------------------------------------------------------- reads

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj | None:
        obj = self._objects.get(rt, {}).get((self._ns(rt, namespace), name))
        return copy.deepcopy(obj) if obj is not None else None

    def items(self, rt: ResourceType) -> list[Obj]:
        """Current objects of rt in key order (shared: do not mutate)."""
        objects = self._objects.get(rt, {})
        return [objects[k] for k in sorted(objects)]

    def oldest_rv(self, rt: ResourceType) -> int:
        """Watching or listing from an RV older than this gets 410 Expired."""
        return max(self.compacted_rv, self._floor.get(rt, 0))

    def events_since(self, rt: ResourceType, rv: int) -> list[Event]:
        """Every event of rt after rv; ApiError 410/504 when rv is unusable."""
        self._check_rv(rt, rv)
        return [ev for ev in self._history.get(rt, ()) if ev.rv > rv]

    def state_at(self, rt: ResourceType, rv: int) -> list[Obj]:
        """The objects of rt as they were at rv, in key order (shared)."""
        self._check_rv(rt, rv)
        state = dict(self._objects.get(rt, {}))
        for ev in reversed(self._history.get(rt, ())):
            if ev.rv <= rv:
                break
            key = object_key(ev.obj)
            if ev.prev is None:
                state.pop(key, None)
            else:
                state[key] = ev.prev
        return [state[k] for k in sorted(state)]

    def _check_rv(self, rt: ResourceType, rv: int) -> None:
        if rv < self.oldest_rv(rt):
            raise expired(rv, self.oldest_rv(rt))
        if rv > self.rv:
            raise too_large(rv, self.rv)

    # ------------------------------------------------------------- mutations

    def create(self, rt: ResourceType, obj: Obj) -> Event:
        new = self._normalize(rt, obj)
        meta = new["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not meta.get("name"):
            raise ApiError(422, "Invalid", f"{rt.kind} is invalid: metadata.name: Required value")
        key = object_key(new)
        if key in self._objects.get(rt, {}):
            details = {"name": key[1], "group": rt.group, "kind": rt.plural}
            message = f'{_resource_name(rt)} "{key[1]}" already exists'
            raise ApiError(409, "AlreadyExists", message, details)
        meta.pop("resourceVersion", None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        self._apply_defaults(rt, new, None)
        return self._commit(rt, "ADDED", new, None)

    def update(self, rt: ResourceType, obj: Obj, check_rv: bool = True) -> Event | None:
        """Replace an object; None when nothing changed (no new RV, no event),
        as kube-apiserver does for no-op updates."""
        new = self._normalize(rt, obj)
        key = object_key(new)
        old = self._objects.get(rt, {}).get(key)
        if old is None:
            raise not_found(rt, key[1])
        sent_rv = new["metadata"].get("resourceVersion")
        if check_rv and sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise conflict(rt, key[1])
        self._carry_system_fields(new, old)
        self._apply_defaults(rt, new, old)
        if new == old:
            return None
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        return self._commit(rt, "MODIFIED", new, old)

    def delete(self, rt: ResourceType, namespace: str, name: str) -> Event:
        key = (self._ns(rt, namespace), name)
        old = self._objects.get(rt, {}).get(key)
        if old is None:
            raise not_found(rt, name)
        return self._commit(rt, "DELETED", old, old)

    def compact(self) -> None:
        """Forget all history up to now: older RVs get 410 Expired."""
        self.compacted_rv = self.rv
        for history in self._history.values():
            history.clear()

    # -------------------------------------------------------------- helpers

    def _commit(self, rt: ResourceType, kind: str, obj: Obj, prev: Obj | None) -> Event:
        self.rv += 1
        stamped = with_rv(obj, self.rv)
        objects = self._objects.setdefault(rt, {})
        if kind == "DELETED":
            del objects[object_key(obj)]
        else:
            objects[object_key(obj)] = stamped
        event = Event(kind, rt, self.rv, stamped, prev)
        self._record(rt, event)
        for listener in list(self.listeners):
            listener(event)
        return event

    def _record(self, rt: ResourceType, event: Event) -> None:
        history = self._history.setdefault(rt, deque())
        history.append(event)
        while len(history) > self.history_limit:
            self._floor[rt] = history.popleft().rv

    @staticmethod
    def _ns(rt: ResourceType, namespace: str | None) -> str:
        return (namespace or "default") if rt.namespaced else ""

    def _normalize(self, rt: ResourceType, obj: Obj) -> Obj:
        rest = {k: v for k, v in copy.deepcopy(obj).items() if k not in ("kind", "apiVersion")}
        new: Obj = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {}, **rest}
        meta = new["metadata"]
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            meta["namespace"] = meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        return new

    @staticmethod
    def _carry_system_fields(new: Obj, old: Obj) -> None:
        for field in ("uid", "creationTimestamp", "generation", "resourceVersion"):
            if field in old["metadata"]:
                new["metadata"][field] = old["metadata"][field]

    def _apply_defaults(self, rt: ResourceType, new: Obj, old: Obj | None) -> None:
        if rt.kind == "Service":
            self._default_service(new, old)
        elif rt.kind == "Namespace":
            _default_namespace(new)
        elif rt.kind == "Secret":
            new.setdefault("type", "Opaque")
        elif rt.kind == "Endpoints":
            for subset in new.get("subsets") or []:
                _default_ports(subset.get("ports"))
        elif rt.kind == "EndpointSlice":
            _default_ports(new.get("ports"))

    def _default_service(self, new: Obj, old: Obj | None) -> None:
        spec = new.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        old_spec = (old or {}).get("spec") or {}
        if "clusterIP" not in spec and spec["type"] != "ExternalName":
            spec["clusterIP"] = old_spec.get("clusterIP") or self._next_cluster_ip()
        if spec.get("clusterIP") and "clusterIPs" not in spec:
            spec["clusterIPs"] = [spec["clusterIP"]]
        if spec["type"] != "ExternalName":
            spec.setdefault("internalTrafficPolicy", "Cluster")
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
        new.setdefault("status", {"loadBalancer": {}})

    def _next_cluster_ip(self) -> str:
        self._cluster_ips += 1
        n = self._cluster_ips
        return f"10.96.{n // 250}.{n % 250 + 1}"


def conflict(rt: ResourceType, name: str) -> ApiError:
    message = (
        f'Operation cannot be fulfilled on {_resource_name(rt)} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again"
    )
    return ApiError(409, "Conflict", message, {"name": name, "group": rt.group, "kind": rt.plural})


def _default_namespace(new: Obj) -> None:
    labels = new["metadata"].setdefault("labels", {})
    labels["kubernetes.io/metadata.name"] = new["metadata"]["name"]
    new.setdefault("spec", {"finalizers": ["kubernetes"]})
    new.setdefault("status", {"phase": "Active"})


def _default_ports(ports: list[Obj] | None) -> None:
    for port in ports or []:
        port.setdefault("protocol", "TCP")
