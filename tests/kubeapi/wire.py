"""The HTTP wire format the test API server's handlers share.

Owns how a request is read (Go-style query flags, JSON bodies, the resource a
URL names, the selectors in a query) and how an answer is written (compact
JSON, `Status` objects for errors). No state: every handler module uses these.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from . import resources
from .resources import ResourceType
from .selectors import Selector
from .store import ApiError, Obj, bad_request

TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})
JSON = "application/json"


@dataclass(frozen=True)
class Target:
    """A parsed resource URL."""

    rtype: ResourceType
    namespace: str | None  # None: across all namespaces (or cluster-scoped)
    name: str | None


def parse_target(path: str) -> Target:
    """Map /api/v1/... or /apis/<g>/<v>/... to a resource; ApiError 404 otherwise."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise _no_such_resource()
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    rtype = resources.resource_at(group, version, rest[0]) if rest else None
    name = rest[1] if len(rest) == 2 else None
    if (
        rtype is None
        or len(rest) > 2
        or (namespace is not None and not rtype.namespaced)
        or (namespace is None and rtype.namespaced and name is not None)
    ):
        raise _no_such_resource()
    return Target(rtype, namespace, name)


def _no_such_resource() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def parse_bool(value: str | None, name: str) -> bool:
    """Go's strconv.ParseBool, as the API server uses for query flags."""
    if value is None or value == "":
        return False
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise bad_request(f"invalid value for {name}: {value!r}")


def parse_int(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise bad_request(f"invalid value for {name}: {value!r}") from None


def query_selector(query: Mapping[str, str], target: Target) -> Selector:
    """The label and field selectors of a list or watch, within the target's namespace."""
    try:
        return Selector.parse(
            query.get("labelSelector"), query.get("fieldSelector"), target.namespace
        )
    except ValueError as error:
        raise bad_request(str(error)) from None


async def read_json(request: web.Request) -> Any:
    try:
        return json.loads(await request.read() or b"null")
    except ValueError as error:
        raise bad_request(f"invalid JSON body: {error}") from None


def json_response(body: Obj, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(), status=status, content_type=JSON
    )


def status_response(error: ApiError) -> web.Response:
    response = json_response(error.status(), error.code)
    response.headers.update(error.headers)
    return response
