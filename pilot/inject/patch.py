"""An RFC 6902 JSON patch from one pod to another, as the webhook answers with.

Only `add` and `replace`, as Istio's webhook sends. An object that only gained keys
or changed values is compared key by key (an `add` per new key, a step down into
each changed value); one that lost a key (a probe whose tcpSocket became httpGet)
is replaced whole. A list the template only grew (items put in front, as the sidecar's
containers, or after, as its volumes) gets an `add` per new item and a step down
into each kept one (a container whose probes were rewritten); any other change
replaces the list whole. So the patch stays the size of what was injected, not of
the pod (a pod of 500 containers is not sent back whole). Keys are escaped as
JSON Pointer says (`~` as `~0`, `/` as `~1`: annotation names have slashes).
"""

from __future__ import annotations

from typing import Any


def pointer(path: list[str]) -> str:
    """The JSON Pointer of a path of keys."""
    return "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in path)


def create_patch(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Operations that turn `old` into `new` (both JSON objects); [] when equal."""
    # The root cannot be replaced: a key it lost is removed (the template removes none).
    operations = [{"op": "remove", "path": pointer([key])} for key in old if key not in new]
    _diff(old, new, [], operations)
    return operations


def _same(old: Any, new: Any) -> bool:
    """Equal as JSON: Python's `True == 1` and `1 == 1.0` are different JSON values."""
    if type(old) is not type(new):
        return False
    if isinstance(old, dict):
        return old.keys() == new.keys() and all(_same(old[key], new[key]) for key in old)
    if isinstance(old, list):
        return len(old) == len(new) and all(_same(a, b) for a, b in zip(old, new, strict=True))
    return bool(old == new)


def _diff(
    old: dict[str, Any], new: dict[str, Any], path: list[str], out: list[dict[str, Any]]
) -> None:
    for key, value in new.items():
        if key not in old:
            out.append({"op": "add", "path": pointer([*path, key]), "value": value})
        else:
            _step(old[key], value, [*path, key], out)


def _step(old: Any, new: Any, path: list[str], out: list[dict[str, Any]]) -> None:
    """The operations for one value that is in both."""
    if isinstance(old, dict) and isinstance(new, dict) and old.keys() <= new.keys():
        _diff(old, new, path, out)
    elif isinstance(old, list) and isinstance(new, list) and _grown(old, new, path, out):
        return
    elif not _same(old, new):
        out.append({"op": "replace", "path": pointer(path), "value": new})


def _kin(old: Any, new: Any) -> bool:
    """The same item, perhaps changed: equal, or objects of the same name."""
    if isinstance(old, dict) and isinstance(new, dict) and "name" in old:
        return _same(old["name"], new.get("name"))
    return _same(old, new)


def _grown(old: list[Any], new: list[Any], path: list[str], out: list[dict[str, Any]]) -> bool:
    """Operations for `new` as `old` with items added in front or after; False (and no
    operation) when `new` is not that."""
    added = len(new) - len(old)
    if added < 0:
        return False
    if all(_kin(a, b) for a, b in zip(old, new[added:], strict=True)):
        start, offset = 0, added  # added in front: the old items move up
    elif all(_kin(a, b) for a, b in zip(old, new, strict=False)):
        start, offset = len(old), 0  # added after
    else:
        return False
    # Added in order, each at its final index: what follows moves up as it would.
    out.extend(
        {"op": "add", "path": pointer([*path, str(start + n)]), "value": new[start + n]}
        for n in range(added)
    )
    for index, item in enumerate(old):
        _step(item, new[index + offset], [*path, str(index + offset)], out)
    return True
