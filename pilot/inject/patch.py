"""An RFC 6902 JSON patch from one pod to another, as the webhook answers with.

Objects are compared key by key (`add`, `remove`, or a step down into a changed
value); a changed list is replaced whole, which every API server accepts and which
keeps the patch a plain function of the two pods (Istio diffs lists item by item;
the pod the server ends with is the same). Keys are escaped as JSON Pointer says
(`~` as `~0`, `/` as `~1`: annotation names have slashes).
"""

from __future__ import annotations

from typing import Any


def pointer(path: list[str]) -> str:
    """The JSON Pointer of a path of keys."""
    return "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in path)


def create_patch(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Operations that turn `old` into `new` (both JSON objects); [] when equal."""
    operations: list[dict[str, Any]] = []
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
    for key in old:
        if key not in new:
            out.append({"op": "remove", "path": pointer([*path, key])})
    for key, value in new.items():
        if key not in old:
            out.append({"op": "add", "path": pointer([*path, key]), "value": value})
        elif isinstance(old[key], dict) and isinstance(value, dict):
            _diff(old[key], value, [*path, key], out)
        elif not _same(old[key], value):
            out.append({"op": "replace", "path": pointer([*path, key]), "value": value})
