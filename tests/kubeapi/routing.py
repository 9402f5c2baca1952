"""HTTP routing of the test API server: `Router`.

Owns the aiohttp application and what every request goes through: the
record tests read back (`RequestRecord`), the optional bearer-token check, the
discovery documents and health endpoints, and dispatch to the handler that
owns the request (TokenReview, list, watch, or an object request), whole
objects or their metadata only (metadata.py). An `ApiError` from any handler
becomes a `Status` response here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from aiohttp import web

from . import lists, metadata, objects, resources
from .changes import Changes
from .faults import Faults
from .store import ApiError, Obj, Store
from .tokens import TOKEN_REVIEW_PATH, TokenReviewer
from .watches import WatchHub
from .wire import TRUE, Target, json_response, parse_bool, parse_target, status_response

HEALTH_PATHS = ("/healthz", "/readyz", "/livez")
MAX_BODY = 16 * 1024 * 1024


class RequestRecord(NamedTuple):
    """One request the server received."""

    method: str
    path: str
    query: dict[str, str]
    is_watch: bool
    accept: str = ""


class Router:
    """Receives every request, records it, checks it, and hands it to its handler."""

    def __init__(
        self,
        store: Store,
        watches: WatchHub,
        faults: Faults,
        tokens: TokenReviewer,
        changes: Changes,
        *,
        address: Callable[[], str],
        require_token: str | None,
        extra_routes: Sequence[web.AbstractRouteDef],
    ) -> None:
        self.store = store
        self.watches = watches
        self.faults = faults
        self.tokens = tokens
        self.changes = changes
        self.address = address  # host:port, as the discovery documents give it
        self.require_token = require_token
        self.extra_routes: list[web.AbstractRouteDef] = list(extra_routes)
        self.requests: list[RequestRecord] = []

    def app(self) -> web.Application:
        """A fresh application: the extra routes first, then the API."""
        app = web.Application(client_max_size=MAX_BODY)
        app.add_routes(self.extra_routes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        is_watch = request.query.get("watch", "") in TRUE
        accept = request.headers.get("Accept", "")
        self.requests.append(
            RequestRecord(request.method, request.path, dict(request.query), is_watch, accept)
        )
        self.changes.notify()
        await self.faults.hold_if_hung(request.path)
        if self.faults.drops(request.path) and request.transport is not None:
            request.transport.abort()
            return web.Response()  # never sent: the connection is gone
        try:
            self._authorize(request)
            return await self._route(request, is_watch)
        except ApiError as error:
            return status_response(error)

    def _authorize(self, request: web.Request) -> None:
        if self.require_token is None:
            return
        if request.headers.get("Authorization", "") != f"Bearer {self.require_token}":
            raise ApiError(401, "Unauthorized", "Unauthorized")

    async def _route(self, request: web.Request, is_watch: bool) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        discovery = self._discovery(path)
        if discovery is not None:
            return json_response(discovery)
        if path in HEALTH_PATHS:
            return web.Response(text="ok")
        if path == TOKEN_REVIEW_PATH and request.method == "POST":
            return await self.tokens.handle(request)
        target = parse_target(path)
        if target.name is None:
            return await self._collection(request, target, is_watch)
        return await objects.serve_item(self.store, request, target)

    def _discovery(self, path: str) -> Obj | None:
        if path == "/version":
            return dict(resources.VERSION_DOC)
        if path == "/api":
            return resources.api_versions_doc(self.address())
        if path == "/apis":
            return resources.api_group_list_doc()
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) == 2:
            return resources.api_resource_list_doc("", parts[1])
        if parts[0] == "apis" and len(parts) == 2:
            return resources.api_group_doc(parts[1])
        if parts[0] == "apis" and len(parts) == 3:
            return resources.api_resource_list_doc(parts[1], parts[2])
        return None

    async def _collection(
        self, request: web.Request, target: Target, is_watch: bool
    ) -> web.StreamResponse:
        if request.method == "GET":
            parse_bool(request.query.get("watch"), "watch")
            only_metadata = metadata.wants_metadata(request.headers.get("Accept", ""), is_watch)
            if is_watch:
                shape = metadata.item if only_metadata else None
                return await self.watches.serve(request, target, shape)
            self.faults.check_list()
            body = lists.list_body(self.store, request.query, target)
            return json_response(metadata.list_of(body) if only_metadata else body)
        if request.method == "POST":
            return await objects.create(self.store, request, target)
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")
