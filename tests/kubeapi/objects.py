"""Object requests of the test API server: create, get, replace, patch, delete.

Owns POST on a collection and GET/PUT/PATCH/DELETE on a named object: reading
the body into an object of the URL's type and namespace, the two patch formats
(RFC 7386 merge patch, also used for strategic merge patch, and RFC 6902 JSON
patch), and the `Status` a delete answers. Also `replace`, which the server's
own update methods share with PUT.
"""

from __future__ import annotations

import copy
from typing import Any

from aiohttp import web

from .resources import ResourceType
from .store import ApiError, Event, Obj, Store, bad_request, not_found
from .wire import Target, json_response, read_json


async def create(store: Store, request: web.Request, target: Target) -> web.Response:
    """POST on a collection."""
    if not (target.namespace or not target.rtype.namespaced):
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")
    body = await _read_object(request, target)
    return json_response(store.create(target.rtype, body).obj, 201)


async def serve_item(store: Store, request: web.Request, target: Target) -> web.Response:
    """GET, DELETE, PUT or PATCH on a named object."""
    assert target.name is not None
    rtype, namespace, name = target.rtype, target.namespace or "", target.name
    if request.method == "GET":
        obj = store.get(rtype, namespace, name)
        if obj is None:
            raise not_found(rtype, name)
        return json_response(obj)
    if request.method == "DELETE":
        return json_response(_delete_status(rtype, store.delete(rtype, namespace, name)))
    if request.method == "PUT":
        return json_response(replace(store, rtype, await _read_object(request, target)))
    if request.method == "PATCH":
        return json_response(await _patch(store, request, target))
    raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")


def replace(store: Store, rtype: ResourceType, obj: Obj, *, check_rv: bool = True) -> Obj:
    """Update obj in place of the stored one; a no-op update answers the stored object."""
    event = store.update(rtype, obj, check_rv=check_rv)
    if event is not None:
        return event.obj
    meta = obj.get("metadata") or {}
    current = store.get(rtype, meta.get("namespace") or "", meta.get("name") or "")
    assert current is not None
    return current


async def _patch(store: Store, request: web.Request, target: Target) -> Obj:
    assert target.name is not None
    current = store.get(target.rtype, target.namespace or "", target.name)
    if current is None:
        raise not_found(target.rtype, target.name)
    patch = await read_json(request)
    content_type = request.headers.get("Content-Type", "")
    if "json-patch" in content_type and isinstance(patch, list):
        try:
            patched = json_patch(current, patch)
        except (KeyError, IndexError, ValueError, TypeError) as error:
            raise ApiError(422, "Invalid", f"invalid JSON patch: {error!r}") from None
    elif "merge-patch" in content_type and isinstance(patch, dict):
        patched = merge_patch(current, patch)
    else:
        raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {content_type}")
    return replace(store, target.rtype, patched)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also used for strategic merge patch)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(doc: Obj, ops: list[Obj]) -> Obj:
    """RFC 6902 JSON patch: add, remove, replace, test."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
        ]
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        _json_patch_op(node, op, last)
    return doc


def _json_patch_op(node: Any, op: Obj, last: str) -> None:
    kind = op["op"]
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(index, op["value"])
        elif kind == "remove":
            node.pop(index)
        elif kind == "replace":
            node[index] = op["value"]
        elif kind == "test" and node[index] != op["value"]:
            raise ApiError(422, "Invalid", f"test operation failed at {op['path']}")
        return
    if kind in ("add", "replace"):
        node[last] = op["value"]
    elif kind == "remove":
        del node[last]
    elif kind == "test" and node.get(last) != op["value"]:
        raise ApiError(422, "Invalid", f"test operation failed at {op['path']}")


def _delete_status(rtype: ResourceType, event: Event) -> Obj:
    meta = event.obj["metadata"]
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": meta["name"],
            "group": rtype.group,
            "kind": rtype.plural,
            "uid": meta.get("uid", ""),
        },
    }


async def _read_object(request: web.Request, target: Target) -> Obj:
    """The request body as an object of the target's type in the target's namespace."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("the body of the request must be an object")
    meta = body.setdefault("metadata", {})
    if target.namespace is not None:
        if meta.get("namespace") not in (None, "", target.namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent "
                "on the request"
            )
        meta["namespace"] = target.namespace
    if target.name is not None and meta.get("name") not in (None, target.name):
        raise bad_request("the name of the object does not match the name on the URL")
    if target.name is not None:
        meta["name"] = target.name
    body["kind"] = target.rtype.kind
    return body
