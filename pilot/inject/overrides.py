"""A pod's own `istio-proxy` or `istio-init`, merged over the injected one.

Istio's "customizing injection": a pod may declare a container of the injector's
names (in `containers` or `initContainers`, whatever the sidecar mode) and its fields
win over the template's, merged as Kubernetes' strategic merge patch merges a
container (what Istio's webhook runs): a scalar or a plain list replaces ours; an
object (resources, securityContext, probes, lifecycle) merges key by key; `env`
merges by name, `ports` by containerPort, `volumeMounts` by mountPath,
`volumeDevices` by devicePath (a new one is appended). `image: auto` keeps ours, as
Istio. Two choices Istio does not make: a probe or lifecycle handler the pod gives
replaces ours whole, as an env entry's value or valueFrom replaces ours (beside ours,
the API server would refuse the pod for two handlers or two sources); and the merged
container is checked again as the template's own (image, env, mounts, ports,
restartPolicy, the uid that reaches istio-init's `-u`), so a customization never
yields a pod the injector would not have made well formed.
"""

from __future__ import annotations

import copy
from typing import Any

from pilot.inject.errors import InjectError
from pilot.inject.settings import InjectSettings, is_image
from pilot.inject.shape import mapping, objects, sequence, shown

AUTO_IMAGE = "auto"  # Istio's: "the injector's image"
_MERGE_KEYS = {
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
}
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
# One of these in a probe or lifecycle handler excludes the others (a Kubernetes union),
# as an env entry's value and valueFrom.
_HANDLERS = frozenset({"exec", "httpGet", "tcpSocket", "grpc", "sleep"})
_ENV_SOURCES = frozenset({"value", "valueFrom"})
_NONE: frozenset[str] = frozenset()
_MAX_UID = 2147483647  # Kubernetes' bound on runAsUser and runAsGroup


def take(spec: dict[str, Any], names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The pod's own containers of `names`, removed from `spec` (containers and init
    containers, already checked as lists of objects); at most one of each name."""
    found: dict[str, dict[str, Any]] = {}
    for field in ("containers", "initContainers"):
        kept = []
        for container in objects(spec, field, f"spec.{field}"):
            name = container.get("name")
            if name not in names:
                kept.append(container)
            elif name in found:
                raise InjectError(f"spec: more than one container named {name}")
            else:
                found[name] = container
        if field in spec and spec[field] is not None:
            spec[field] = kept
    return found


def merge(ours: dict[str, Any], theirs: dict[str, Any], limit: int) -> dict[str, Any]:
    """`theirs` (the pod's container) merged over `ours` (the template's), a new dict;
    a keyed list of theirs longer than `limit` is refused before any work on it."""
    merged = copy.deepcopy(ours)
    for key, value in theirs.items():
        if value is None or (key == "image" and value == AUTO_IMAGE):
            continue  # Go reads null as unset; `auto` is ours
        where = f"{ours['name']}.{key}"
        current = merged.get(key)
        if key in _MERGE_KEYS:
            merged[key] = _merge_list(
                sequence(merged, key, where), _list(value, where, limit), _MERGE_KEYS[key], where
            )
        elif key == "lifecycle" and isinstance(value, dict) and isinstance(current, dict):
            merged[key] = _merge_lifecycle(current, value)
        elif isinstance(value, dict) and isinstance(current, dict):
            merged[key] = _merge_map(current, value, _HANDLERS if key in _PROBES else _NONE)
        elif isinstance(current, dict):
            raise InjectError(f"{where}: expected an object, got {type(value).__name__}")
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _list(value: Any, where: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise InjectError(f"{where}: expected a list, got {type(value).__name__}")
    if len(value) > limit:
        raise InjectError(f"{where}: {len(value)} entries, over the bound of {limit}")
    return value


def _merge_map(
    ours: dict[str, Any], theirs: dict[str, Any], exclusive: frozenset[str] = _NONE
) -> dict[str, Any]:
    """Key by key, recursively; lists and scalars replace. One of the `exclusive` keys
    in theirs drops all of ours (a probe has one handler, an env entry one source)."""
    merged = copy.deepcopy(ours)
    if exclusive & {key for key, value in theirs.items() if value is not None}:
        merged = {key: value for key, value in merged.items() if key not in exclusive}
    for key, value in theirs.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge_map(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _merge_lifecycle(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """postStart and preStop are each a handler: theirs merges over ours as a probe's."""
    merged = copy.deepcopy(ours)
    for key, value in theirs.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge_map(merged[key], value, _HANDLERS)
        elif value is not None:
            merged[key] = copy.deepcopy(value)
    return merged


def _merge_list(ours: list[Any], theirs: list[Any], key: str, where: str) -> list[Any]:
    """Items merged by `key` (a new key appended), as a strategic merge of a list; found
    by an index, so a long list costs its length, not its square."""
    merged = copy.deepcopy(ours)
    index = {_key(item, key): n for n, item in enumerate(merged) if isinstance(item, dict)}
    exclusive = _ENV_SOURCES if key == "name" else _NONE
    for position, item in enumerate(theirs):
        if not isinstance(item, dict) or item.get(key) is None:
            raise InjectError(f"{where}[{position}]: expected an object with {key}")
        found = index.get(_key(item, key))
        if found is None:
            index[_key(item, key)] = len(merged)
            merged.append(copy.deepcopy(item))
        else:
            merged[found] = _merge_map(merged[found], item, exclusive)
    return merged


def _key(item: dict[str, Any], key: str) -> tuple[str, Any]:
    """An item's merge key, hashable whatever JSON it is (its type kept: 80 is not "80")."""
    value = item.get(key)
    if isinstance(value, (dict, list)):
        return ("json", repr(value))
    return (type(value).__name__, value)


def check(container: dict[str, Any], settings: InjectSettings, *, restart: str | None) -> None:
    """The merged container as the template's own: what reaches the pod is well formed
    and within the injector's bounds. `restart` is the restartPolicy its mode needs."""
    name = container["name"]
    image = container.get("image")
    if not (isinstance(image, str) and is_image(image)):
        raise InjectError(f"{name}.image: {shown(image)} is not an image reference")
    for field in ("resources", "securityContext", "lifecycle", *_PROBES):
        mapping(container, field, f"{name}.{field}")
    for field in ("command", "args"):
        items = sequence(container, field, f"{name}.{field}")
        if not all(isinstance(item, str) for item in items):
            raise InjectError(f"{name}.{field}: expected a list of strings")
    env = objects(container, "env", f"{name}.env")
    if len(env) > settings.max_env:
        raise InjectError(f"{name}.env: {len(env)} entries, over the bound of {settings.max_env}")
    if not all(isinstance(entry.get("name"), str) and entry["name"] for entry in env):
        raise InjectError(f"{name}.env: every entry needs a name")
    mounts = objects(container, "volumeMounts", f"{name}.volumeMounts")
    if len(mounts) > settings.max_volumes:
        raise InjectError(f"{name}.volumeMounts: over the bound of {settings.max_volumes}")
    if not all(
        isinstance(m.get("name"), str) and isinstance(m.get("mountPath"), str) for m in mounts
    ):
        raise InjectError(f"{name}.volumeMounts: every mount needs a name and a mountPath")
    for port in objects(container, "ports", f"{name}.ports"):
        number = port.get("containerPort")
        if not (isinstance(number, int) and not isinstance(number, bool) and 1 <= number <= 65535):
            raise InjectError(f"{name}.ports: {shown(number)} is not a port (1-65535)")
    if container.get("restartPolicy") != restart:
        wanted = f"{restart!r}" if restart else "none"
        raise InjectError(
            f"{name}.restartPolicy: {shown(container.get('restartPolicy'))} in a pod whose"
            f" {name} needs {wanted}"
        )
    security = mapping(container, "securityContext", f"{name}.securityContext")
    for field in ("runAsUser", "runAsGroup"):
        user_id(security, field, f"{name}.securityContext.{field}")


def user_id(security: dict[str, Any], field: str, where: str) -> int | None:
    """securityContext's runAsUser or runAsGroup: None, or an integer Kubernetes takes."""
    value = security.get(field)
    if value is None:
        return None
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_UID):
        raise InjectError(f"{where}: {shown(value)} is not a user or group id (0-{_MAX_UID})")
    return value
