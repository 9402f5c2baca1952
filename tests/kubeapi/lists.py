"""List requests of the test API server: consistent, paged lists.

Owns the list half of the list/watch protocol: which resourceVersion a list is
served at (current, `resourceVersionMatch=Exact`, too large), pages of `limit`
items with `continue` tokens that keep serving the snapshot of the first page
(410 Expired once compaction has forgotten it), `remainingItemCount`, and the
typed list body.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping

from .resources import ResourceType
from .store import ApiError, Key, Obj, Store, bad_request, object_key, too_large
from .wire import Target, parse_int, query_selector

CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter, or use the continue token "
    "in this response to retrieve the remainder of the results. Continuing with the "
    "provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may "
    "show up in the list."
)


def list_body(store: Store, query: Mapping[str, str], target: Target) -> Obj:
    """The (page of the) list a GET on a collection answers."""
    selector = query_selector(query, target)
    limit = parse_int(query.get("limit"), "limit") or 0
    rv, items, after = _snapshot(store, target.rtype, query)
    matching = [o for o in items if selector.matches(o) and object_key(o) > after]
    page = matching[:limit] if limit > 0 else matching
    meta: Obj = {"resourceVersion": str(rv)}
    if len(page) < len(matching):
        meta["continue"] = encode_continue(rv, object_key(page[-1]))
        if not selector.filters_content:
            meta["remainingItemCount"] = len(matching) - len(page)
    return {
        "kind": target.rtype.list_kind,
        "apiVersion": target.rtype.api_version,
        "metadata": meta,
        "items": [list_item(o) for o in page],
    }


def list_item(obj: Obj) -> Obj:
    """Items of a typed list carry no kind/apiVersion on the wire."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def _snapshot(
    store: Store, rtype: ResourceType, query: Mapping[str, str]
) -> tuple[int, list[Obj], Key]:
    """(list RV, objects in key order, key to continue after)."""
    token = query.get("continue")
    rv_param = query.get("resourceVersion", "")
    if token:
        if rv_param not in ("", "0"):
            raise bad_request("specifying resource version is not allowed when using continue")
        return _continued_snapshot(store, rtype, token)
    match = query.get("resourceVersionMatch", "")
    requested = parse_int(rv_param, "resourceVersion") or 0
    if match == "Exact":
        return requested, store.state_at(rtype, requested), ("", "")
    if requested > store.rv:
        raise too_large(requested, store.rv)
    return store.rv, store.items(rtype), ("", "")


def _continued_snapshot(
    store: Store, rtype: ResourceType, token: str
) -> tuple[int, list[Obj], Key]:
    rv, after = decode_continue(token)
    try:
        return rv, store.state_at(rtype, rv), after
    except ApiError as error:
        if error.code != 410:
            raise
        raise ApiError(410, "Expired", CONTINUE_EXPIRED) from None


def encode_continue(rv: int, key: Key) -> str:
    """A continue token as kube-apiserver shapes it: the list RV and the last key served."""
    token = {"v": "meta.k8s.io/v1", "rv": rv, "start": f"{key[0]}/{key[1]}\x00"}
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, Key]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        namespace, name = raw["start"].rstrip("\x00").split("/", 1)
        return int(raw["rv"]), (namespace, name)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise bad_request(f"continue key is not valid: {token!r}") from None
