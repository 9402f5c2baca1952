"""A small RFC 6902 applier (add, remove, replace, test; JSON Pointer escapes), so the
tests apply the webhook's patch as an API server would, with a second implementation."""

from __future__ import annotations

import copy
from typing import Any


class PatchError(Exception):
    """An operation an API server would refuse."""


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"{path!r}: a JSON Pointer starts with '/'")
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _index(container: list[Any], token: str, *, adding: bool) -> int:
    if token == "-" and adding:
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise PatchError(f"{token!r}: not an array index")
    index = int(token)
    if index > len(container) or (index == len(container) and not adding):
        raise PatchError(f"{index}: out of range")
    return index


def _parent(document: Any, tokens: list[str]) -> Any:
    for token in tokens:
        if isinstance(document, dict):
            if token not in document:
                raise PatchError(f"{token!r}: no such member")
            document = document[token]
        elif isinstance(document, list):
            document = document[_index(document, token, adding=False)]
        else:
            raise PatchError(f"{token!r}: a scalar has no members")
    return document


def apply_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """`document` with `operations` applied (a new object)."""
    result = copy.deepcopy(document)
    for operation in operations:
        tokens = _tokens(operation["path"])
        if not tokens:
            raise PatchError("the patch replaces the whole object")
        parent, last = _parent(result, tokens[:-1]), tokens[-1]
        op = operation["op"]
        if op == "add":
            _add(parent, last, copy.deepcopy(operation["value"]))
        elif op == "remove":
            _remove(parent, last)
        elif op == "replace":
            _remove(parent, last)
            _add(parent, last, copy.deepcopy(operation["value"]))
        elif op == "test":
            if _parent(parent, [last]) != operation["value"]:
                raise PatchError(f"test failed at {operation['path']}")
        else:
            raise PatchError(f"{op!r}: not an operation this applier knows")
    return result


def _add(parent: Any, token: str, value: Any) -> None:
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, adding=True), value)
    else:
        raise PatchError(f"{token!r}: cannot add to a scalar")


def _remove(parent: Any, token: str) -> None:
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(f"{token!r}: no such member to remove")
        del parent[token]
    elif isinstance(parent, list):
        del parent[_index(parent, token, adding=False)]
    else:
        raise PatchError(f"{token!r}: cannot remove from a scalar")
