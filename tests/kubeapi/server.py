"""`KubeAPIServer`: a small Kubernetes API server for tests, over real HTTP.

Owns the aiohttp application, request routing (discovery, CRUD, list, watch,
TokenReview), the open watch streams and the fault switches tests flip
(dropped watches, compaction/410, failing lists, stop/start on the same port).
It speaks the list/watch protocol the way kube-apiserver does, so a program
using the real kubernetes_asyncio client through a kubeconfig cannot tell.
Objects live in `store.Store`; selectors in `selectors`; resource types in
`resources`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import enum
import json
import secrets
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import yaml
from aiohttp import web

from . import resources
from .resources import ResourceType
from .selectors import Selector
from .store import (
    ApiError,
    Event,
    Obj,
    Store,
    bad_request,
    not_found,
    object_key,
    too_large,
    with_rv,
)

_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})
_TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
_JSON = "application/json"
SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")


class RequestRecord(NamedTuple):
    """One request the server received."""

    method: str
    path: str
    query: dict[str, str]
    is_watch: bool


@dataclass(frozen=True)
class TokenIdentity:
    """The service account a bearer token belongs to (for TokenReview)."""

    namespace: str
    service_account: str
    audiences: list[str] = field(default_factory=lambda: ["istio-ca"])
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def groups(self) -> list[str]:
        return [
            "system:serviceaccounts",
            f"system:serviceaccounts:{self.namespace}",
            "system:authenticated",
        ]


@dataclass(frozen=True)
class TokenReviewRecord:
    """One TokenReview the server answered."""

    token: str
    audiences: list[str]
    authenticated: bool
    username: str | None


class _Control(enum.Enum):
    END = "end"  # finish the response body cleanly
    ABORT = "abort"  # cut the connection


@dataclass(frozen=True)
class _Target:
    """A parsed resource URL."""

    rtype: ResourceType
    namespace: str | None  # None: across all namespaces (or cluster-scoped)
    name: str | None


@dataclass(frozen=True)
class _WatchParams:
    resource_version: int | None  # None: start with the current state
    send_initial: bool
    bookmarks: bool
    timeout: float | None


@dataclass(eq=False)
class _Watch:
    """One open watch stream."""

    rtype: ResourceType
    selector: Selector
    bookmarks: bool
    last_rv: int
    queue: asyncio.Queue[bytes | _Control] = field(default_factory=asyncio.Queue)

    def offer(self, event: Event, lines: dict[str, bytes] | None = None) -> None:
        """Queue what this watch sees of event; `lines` caches the encoding of
        event.obj per event type across the watches of one event."""
        projected = project_event(event, self.selector)
        if projected is None:
            return
        event_type, obj = projected
        if lines is None or obj is not event.obj:
            self.push(event_type, obj)
            return
        if event_type not in lines:
            lines[event_type] = event_line(event_type, obj)
        self.last_rv = max(self.last_rv, event.rv)
        self.queue.put_nowait(lines[event_type])

    def push(self, event_type: str, obj: Obj) -> None:
        self.last_rv = max(self.last_rv, int(obj["metadata"]["resourceVersion"]))
        self.queue.put_nowait(event_line(event_type, obj))

    def push_bookmark(self, rv: int, annotations: dict[str, str] | None = None) -> None:
        meta: Obj = {"resourceVersion": str(rv)}
        if annotations:
            meta["annotations"] = annotations
        obj = {"kind": self.rtype.kind, "apiVersion": self.rtype.api_version, "metadata": meta}
        self.last_rv = max(self.last_rv, rv)
        self.queue.put_nowait(event_line("BOOKMARK", obj))


def event_line(event_type: str, obj: Obj) -> bytes:
    """One watch event as the JSON line kube-apiserver writes."""
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def project_event(event: Event, selector: Selector) -> tuple[str, Obj] | None:
    """What a watcher with `selector` sees of `event`, like the watch cache: an
    object entering the selection is ADDED, one leaving it is DELETED (previous
    content, new resourceVersion)."""
    now = selector.matches(event.obj)
    before = event.prev is not None and selector.matches(event.prev)
    if event.type == "DELETED":
        return ("DELETED", event.obj) if now else None
    if now and before:
        return ("MODIFIED", event.obj)
    if now:
        return ("ADDED", event.obj)
    if before and event.prev is not None:
        return ("DELETED", with_rv(event.prev, event.rv))
    return None


def parse_bool(value: str | None, name: str) -> bool:
    """Go's strconv.ParseBool, as the API server uses for query flags."""
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise bad_request(f"invalid value for {name}: {value!r}")


def parse_int(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise bad_request(f"invalid value for {name}: {value!r}") from None


def encode_continue(rv: int, key: tuple[str, str]) -> str:
    token = {"v": "meta.k8s.io/v1", "rv": rv, "start": f"{key[0]}/{key[1]}\x00"}
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        namespace, name = raw["start"].rstrip("\x00").split("/", 1)
        return int(raw["rv"]), (namespace, name)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise bad_request(f"continue key is not valid: {token!r}") from None


def list_item(obj: Obj) -> Obj:
    """Items of a typed list carry no kind/apiVersion on the wire."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def json_response(body: Obj, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(), status=status, content_type=_JSON
    )


def status_response(error: ApiError) -> web.Response:
    return json_response(error.status(), error.code)


def parse_target(path: str) -> _Target:
    """Map /api/v1/... or /apis/<g>/<v>/... to a resource; ApiError 404 otherwise."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
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
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return _Target(rtype, namespace, name)


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


class KubeAPIServer:
    """A Kubernetes API server for tests (see module docstring).

    Mutation methods are synchronous and must be called from the event loop
    the server runs in (or while it is stopped).
    """

    def __init__(
        self,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        bookmark_interval: float = 1.0,
        require_token: str | None = None,
        history_limit: int = 100_000,
        system_namespaces: bool = True,
        extra_routes: Sequence[web.AbstractRouteDef] = (),
    ) -> None:
        self.host = host
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.require_token = require_token
        self.store = Store(history_limit=history_limit)
        self.store.listeners.append(self._on_event)
        self.requests: list[RequestRecord] = []
        self.tokens: dict[str, TokenIdentity] = {}
        self.token_reviews: list[TokenReviewRecord] = []
        self.extra_routes: list[web.AbstractRouteDef] = list(extra_routes)
        self._watches: set[_Watch] = set()
        self._fail_lists: int | None = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._runner: web.AppRunner | None = None
        if system_namespaces:
            for name in SYSTEM_NAMESPACES:
                self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        """Listen (again) on host:port; the first start picks a free port if port is 0."""
        if self._runner is not None:
            return
        runner = web.AppRunner(
            self._make_app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self.port = int(runner.addresses[0][1])
        self._runner = runner

    async def stop(self) -> None:
        """Go away like a crashed API server: cut open watches, close the port.
        The state is kept; `start()` serves it again on the same port."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self.drop_watches()
        await runner.cleanup()

    async def __aenter__(self) -> KubeAPIServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.add_routes(self.extra_routes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    # ------------------------------------------------------- state for tests

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return str(self.store.rv)

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def open_watches_for(self, kind: str) -> int:
        rtype = resources.resource_type(kind)
        return sum(1 for w in self._watches if w.rtype == rtype)

    def requests_for(self, kind: str, *, watch: bool | None = None) -> list[RequestRecord]:
        """Recorded requests on one resource type; watch=True/False narrows to
        watches/non-watches."""
        rtype = resources.resource_type(kind)
        found: list[RequestRecord] = []
        for record in self.requests:
            with contextlib.suppress(ApiError):
                if parse_target(record.path).rtype == rtype and watch in (None, record.is_watch):
                    found.append(record)
        return found

    async def wait_until(
        self,
        predicate: Callable[[], bool],
        timeout: float = 5.0,  # noqa: ASYNC109 - a deadline is the point of this helper
    ) -> None:
        """Wait until predicate() holds. It is re-checked after every request,
        mutation and watch open/close, and every 50 ms (for predicates on state
        outside the server). TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while not predicate():
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    await asyncio.wait([waiter], timeout=0.05)
                finally:
                    self._waiters.remove(waiter)

    async def wait_for_watches(
        self,
        count: int,
        timeout: float = 5.0,  # noqa: ASYNC109 - a deadline is the point of this helper
        kind: str | None = None,
    ) -> None:
        """Wait until at least `count` watches (of `kind`, if given) are open."""

        def enough() -> bool:
            return (self.open_watches_for(kind) if kind else self.open_watches) >= count

        await self.wait_until(enough, timeout)

    def _notify(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -------------------------------------------------------------- objects

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        return self.store.get(resources.resource_type(kind), namespace or "", name)

    def objects(self, kind: str, namespace: str | None = None) -> list[Obj]:
        rtype = resources.resource_type(kind)
        selector = Selector(namespace=namespace)
        return [copy.deepcopy(o) for o in self.store.items(rtype) if selector.matches(o)]

    def create(self, obj: Obj) -> Obj:
        """Create; ApiError 409 AlreadyExists if it exists."""
        return copy.deepcopy(self.store.create(_rtype_of(obj), obj).obj)

    def update(self, obj: Obj) -> Obj:
        """Replace; ApiError 404 if missing, 409 Conflict if obj carries a stale
        metadata.resourceVersion. A no-op update changes nothing (no event)."""
        rtype = _rtype_of(obj)
        event = self.store.update(rtype, obj)
        return copy.deepcopy(event.obj) if event else self._current(rtype, obj)

    def apply(self, obj: Obj) -> Obj:
        """Create or unconditionally replace, by kind/namespace/name."""
        rtype = _rtype_of(obj)
        meta = obj.get("metadata") or {}
        if self.store.get(rtype, meta.get("namespace") or "", meta.get("name") or "") is None:
            return self.create(obj)
        event = self.store.update(rtype, obj, check_rv=False)
        return copy.deepcopy(event.obj) if event else self._current(rtype, obj)

    def delete(self, kind: str, namespace: str | None, name: str) -> Obj:
        """Delete; returns the last state. ApiError 404 if missing."""
        rtype = resources.resource_type(kind)
        return copy.deepcopy(self.store.delete(rtype, namespace or "", name).obj)

    def load_yaml(self, text: str) -> list[Obj]:
        """Apply every object of a (multi-document, or kind: List) YAML text."""
        applied: list[Obj] = []
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            is_list = str(doc.get("kind", "")).endswith("List")
            items = (doc.get("items") or []) if is_list else [doc]
            applied.extend(self.apply(item) for item in items)
        return applied

    def _current(self, rtype: ResourceType, obj: Obj) -> Obj:
        meta = obj.get("metadata") or {}
        current = self.store.get(rtype, meta.get("namespace") or "", meta.get("name") or "")
        assert current is not None
        return current

    # -------------------------------------------------------- fault switches

    def drop_watches(self, abrupt: bool = True) -> None:
        """End every open watch: abrupt cuts the connection (a crashed server),
        otherwise the body ends cleanly (a server-side watch timeout)."""
        control = _Control.ABORT if abrupt else _Control.END
        for watch in self._watches:
            watch.queue.put_nowait(control)
        self._forget_watches()

    def _forget_watches(self) -> None:
        """Ended watches stop counting (and receiving) at once, not when their
        handler gets round to closing the stream."""
        self._watches.clear()
        self._notify()

    def compact(self) -> None:
        """Forget history up to now: watching or paging from an older RV gets 410."""
        self.store.compact()

    def expire_watches(self) -> None:
        """Compact, then end every open watch with a 410 Expired ERROR event."""
        self.compact()
        for watch in self._watches:
            error = ApiError(
                410,
                "Expired",
                f"too old resource version: {watch.last_rv} ({self.store.compacted_rv})",
            )
            watch.queue.put_nowait(event_line("ERROR", error.status()))
            watch.queue.put_nowait(_Control.END)
        self._forget_watches()

    def fail_lists(self, n: int | None = None) -> None:
        """The next n list requests (all, if None, until fail_lists(0)) get 500."""
        self._fail_lists = n

    def send_bookmarks(self) -> None:
        """A BOOKMARK now on every open watch that allowed bookmarks."""
        for watch in self._watches:
            if watch.bookmarks:
                watch.push_bookmark(self.store.rv)

    def add_service_account_token(
        self, namespace: str, service_account: str, audiences: Iterable[str] = ("istio-ca",)
    ) -> str:
        """A new opaque bearer token TokenReview will map to the service account."""
        token = secrets.token_urlsafe(32)
        self.tokens[token] = TokenIdentity(namespace, service_account, list(audiences))
        return token

    def _on_event(self, event: Event) -> None:
        lines: dict[str, bytes] = {}
        for watch in self._watches:
            if watch.rtype == event.rtype:
                watch.offer(event, lines)
        self._notify()

    # ------------------------------------------------------------- routing

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        is_watch = request.query.get("watch", "") in _TRUE
        self.requests.append(
            RequestRecord(request.method, request.path, dict(request.query), is_watch)
        )
        self._notify()
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
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok")
        if path == _TOKEN_REVIEW_PATH and request.method == "POST":
            return await self._token_review(request)
        target = parse_target(path)
        if target.name is None:
            return await self._collection(request, target, is_watch)
        return await self._item(request, target)

    def _discovery(self, path: str) -> Obj | None:
        if path == "/version":
            return dict(resources.VERSION_DOC)
        if path == "/api":
            return resources.api_versions_doc(f"{self.host}:{self.port}")
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
        self, request: web.Request, target: _Target, is_watch: bool
    ) -> web.StreamResponse:
        if request.method == "GET":
            parse_bool(request.query.get("watch"), "watch")
            if is_watch:
                return await self._serve_watch(request, target)
            return self._serve_list(request, target)
        if request.method == "POST" and (target.namespace or not target.rtype.namespaced):
            body = await _read_object(request, target)
            return json_response(self.store.create(target.rtype, body).obj, 201)
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")

    async def _item(self, request: web.Request, target: _Target) -> web.StreamResponse:
        assert target.name is not None
        rtype, namespace, name = target.rtype, target.namespace or "", target.name
        if request.method == "GET":
            obj = self.store.get(rtype, namespace, name)
            if obj is None:
                raise not_found(rtype, name)
            return json_response(obj)
        if request.method == "DELETE":
            event = self.store.delete(rtype, namespace, name)
            return json_response(_delete_status(rtype, event))
        if request.method == "PUT":
            body = await _read_object(request, target)
            return json_response(self._put(rtype, body))
        if request.method == "PATCH":
            return json_response(await self._patch(request, target))
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")

    def _put(self, rtype: ResourceType, body: Obj) -> Obj:
        event = self.store.update(rtype, body)
        return event.obj if event else self._current(rtype, body)

    async def _patch(self, request: web.Request, target: _Target) -> Obj:
        assert target.name is not None
        current = self.store.get(target.rtype, target.namespace or "", target.name)
        if current is None:
            raise not_found(target.rtype, target.name)
        patch = await _read_json(request)
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
        return self._put(target.rtype, patched)

    # ---------------------------------------------------------------- list

    def _take_list_failure(self) -> bool:
        if self._fail_lists is None:
            return True
        if self._fail_lists > 0:
            self._fail_lists -= 1
            return True
        return False

    def _serve_list(self, request: web.Request, target: _Target) -> web.Response:
        if self._take_list_failure():
            raise ApiError(500, "InternalError", "Internal error occurred: injected list failure")
        query = request.query
        selector = _selector(query, target)
        limit = parse_int(query.get("limit"), "limit") or 0
        rv, items, after = self._list_snapshot(target.rtype, query)
        matching = [o for o in items if selector.matches(o) and object_key(o) > after]
        page = matching[:limit] if limit > 0 else matching
        meta: Obj = {"resourceVersion": str(rv)}
        if len(page) < len(matching):
            meta["continue"] = encode_continue(rv, object_key(page[-1]))
            if not selector.filters_content:
                meta["remainingItemCount"] = len(matching) - len(page)
        body = {
            "kind": target.rtype.list_kind,
            "apiVersion": target.rtype.api_version,
            "metadata": meta,
            "items": [list_item(o) for o in page],
        }
        return json_response(body)

    def _list_snapshot(
        self, rtype: ResourceType, query: Mapping[str, str]
    ) -> tuple[int, list[Obj], tuple[str, str]]:
        """(list RV, objects in key order, key to continue after)."""
        token = query.get("continue")
        rv_param = query.get("resourceVersion", "")
        if token:
            if rv_param not in ("", "0"):
                raise bad_request("specifying resource version is not allowed when using continue")
            rv, after = decode_continue(token)
            try:
                return rv, self.store.state_at(rtype, rv), after
            except ApiError as error:
                if error.code != 410:
                    raise
                raise ApiError(410, "Expired", _CONTINUE_EXPIRED) from None
        match = query.get("resourceVersionMatch", "")
        requested = parse_int(rv_param, "resourceVersion") or 0
        if match == "Exact":
            return requested, self.store.state_at(rtype, requested), ("", "")
        if requested > self.store.rv:
            raise too_large(requested, self.store.rv)
        return self.store.rv, self.store.items(rtype), ("", "")

    # --------------------------------------------------------------- watch

    def _watch_params(self, query: Mapping[str, str]) -> _WatchParams:
        rv = parse_int(query.get("resourceVersion"), "resourceVersion")
        timeout = parse_int(query.get("timeoutSeconds"), "timeoutSeconds")
        return _WatchParams(
            resource_version=rv or None,
            send_initial=parse_bool(query.get("sendInitialEvents"), "sendInitialEvents"),
            bookmarks=parse_bool(query.get("allowWatchBookmarks"), "allowWatchBookmarks"),
            timeout=float(timeout) if timeout and timeout > 0 else None,
        )

    def _open_watch(self, target: _Target, query: Mapping[str, str]) -> tuple[_Watch, float | None]:
        """Build the watch with its first events queued, and register it unless
        it can only answer an error. Synchronous, so no change slips between
        the initial state and the live events."""
        params = self._watch_params(query)
        watch = _Watch(target.rtype, _selector(query, target), params.bookmarks, self.store.rv)
        try:
            self._queue_start(watch, params)
        except ApiError as error:
            watch.queue.put_nowait(event_line("ERROR", error.status()))
            watch.queue.put_nowait(_Control.END)
            return watch, params.timeout
        self._watches.add(watch)
        self._notify()
        return watch, params.timeout

    def _queue_start(self, watch: _Watch, params: _WatchParams) -> None:
        rtype = watch.rtype
        if params.resource_version is None or params.send_initial:
            if params.resource_version is not None and params.resource_version > self.store.rv:
                raise too_large(params.resource_version, self.store.rv)
            for obj in self.store.items(rtype):
                if watch.selector.matches(obj):
                    watch.push("ADDED", obj)
            watch.last_rv = self.store.rv
            if params.send_initial and params.bookmarks:
                watch.push_bookmark(self.store.rv, {"k8s.io/initial-events-end": "true"})
            return
        watch.last_rv = params.resource_version
        for event in self.store.events_since(rtype, params.resource_version):
            watch.offer(event)

    async def _serve_watch(self, request: web.Request, target: _Target) -> web.StreamResponse:
        watch, timeout = self._open_watch(target, request.query)
        try:
            response = web.StreamResponse(headers={"Content-Type": _JSON})
            response.enable_chunked_encoding()
            writer = await response.prepare(request)
            send_headers = getattr(writer, "send_headers", None)
            if send_headers is not None:
                send_headers()
            if await self._pump(watch, response, timeout):
                await response.write_eof()
            elif request.transport is not None:
                request.transport.abort()
            return response
        finally:
            self._watches.discard(watch)
            self._notify()

    async def _pump(
        self, watch: _Watch, response: web.StreamResponse, duration: float | None
    ) -> bool:
        """Copy queued events to the response until the end; False means abort."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration if duration else None
        next_bookmark = loop.time() + self.bookmark_interval
        while True:
            now = loop.time()
            if deadline is not None and now >= deadline:
                return True
            if watch.bookmarks and now >= next_bookmark:
                watch.push_bookmark(self.store.rv)
                next_bookmark = now + self.bookmark_interval
            wakes = [t for t in (deadline, next_bookmark if watch.bookmarks else None) if t]
            wake = min(wakes, default=now + 3600.0)
            try:
                first = await asyncio.wait_for(watch.queue.get(), max(0.0, wake - now))
            except TimeoutError:
                continue
            chunk, control = _drain(watch.queue, first)
            if chunk:
                await response.write(chunk)
            if control is not None:
                return control is _Control.END

    # ------------------------------------------------------------ tokens

    async def _token_review(self, request: web.Request) -> web.Response:
        review = await _read_json(request)
        if not isinstance(review, dict):
            raise bad_request("TokenReview must be an object")
        spec = review.get("spec") or {}
        token = str(spec.get("token") or "")
        wanted = list(spec.get("audiences") or [])
        status = self._review_status(token, wanted)
        user = status.get("user") or {}
        self.token_reviews.append(
            TokenReviewRecord(
                token, wanted, bool(status.get("authenticated")), user.get("username")
            )
        )
        body = {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }
        return json_response(body, 201)

    def _review_status(self, token: str, wanted: list[str]) -> Obj:
        identity = self.tokens.get(token)
        if identity is None:
            return {"user": {}, "error": "[invalid bearer token, token lookup failed]"}
        granted = [a for a in identity.audiences if a in wanted] if wanted else identity.audiences
        if wanted and not granted:
            return {"user": {}, "error": "[invalid bearer token, token audiences is invalid]"}
        return {
            "authenticated": True,
            "user": {
                "username": identity.username,
                "uid": identity.uid,
                "groups": identity.groups,
            },
            "audiences": granted,
        }


_CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter, or use the continue token "
    "in this response to retrieve the remainder of the results. Continuing with the "
    "provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may "
    "show up in the list."
)


def _drain(
    queue: asyncio.Queue[bytes | _Control], first: bytes | _Control
) -> tuple[bytes, _Control | None]:
    """`first` and whatever else is queued, up to the first control item."""
    lines: list[bytes] = []
    item: bytes | _Control | None = first
    while item is not None:
        if isinstance(item, _Control):
            return b"".join(lines), item
        lines.append(item)
        item = queue.get_nowait() if not queue.empty() else None
    return b"".join(lines), None


def _rtype_of(obj: Obj) -> ResourceType:
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ValueError("object has no kind")
    return resources.resource_type(kind)


def _selector(query: Mapping[str, str], target: _Target) -> Selector:
    try:
        return Selector.parse(
            query.get("labelSelector"), query.get("fieldSelector"), target.namespace
        )
    except ValueError as error:
        raise bad_request(str(error)) from None


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


async def _read_json(request: web.Request) -> Any:
    try:
        return json.loads(await request.read() or b"null")
    except ValueError as error:
        raise bad_request(f"invalid JSON body: {error}") from None


async def _read_object(request: web.Request, target: _Target) -> Obj:
    """The request body as an object of the target's type in the target's namespace."""
    body = await _read_json(request)
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
