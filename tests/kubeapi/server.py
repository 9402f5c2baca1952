"""`KubeAPIServer`: a small Kubernetes API server for tests, over real HTTP.

It speaks the list/watch protocol the way kube-apiserver does, so a program
using the real kubernetes_asyncio client through a kubeconfig cannot tell.
This module owns the server's lifecycle (start, stop like a crash, start again
on the same port) and the synchronous API tests use: objects in and out,
recorded requests, waiting for a condition, and the fault and token switches.
The work is done by the pieces it wires together:

* `store.Store`: objects, resourceVersions, history and compaction;
* `routing.Router`: the aiohttp application, request records, auth, dispatch;
* `lists`: consistent paged lists; `watches.WatchHub`: the open watch streams;
* `metadata`: lists and watches of metadata only (`PartialObjectMetadata`);
* `objects`: create/get/replace/patch/delete requests;
* `tokens.TokenReviewer`: TokenReview; `faults.Faults`: injected faults;
* `changes.Changes`: the signal `wait_until` waits on.
"""

from __future__ import annotations

import contextlib
import copy
import socket
import ssl
from collections.abc import Callable, Iterable, Sequence

import yaml
from aiohttp import web

from . import objects, resources
from .changes import Changes
from .faults import Faults
from .resources import ResourceType
from .routing import RequestRecord, Router
from .selectors import Selector
from .store import ApiError, Obj, Store
from .tokens import TokenIdentity, TokenReviewer, TokenReviewRecord
from .watches import WatchHub
from .wire import parse_target

SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")


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
        ssl_context: ssl.SSLContext | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        # Serve on this listening socket (say, one made in a pod) instead; stop() closes it.
        self.sock = sock
        if sock is not None:
            host, port = sock.getsockname()[:2]
        self.host = host
        self.ssl_context = ssl_context  # serve HTTPS with it (client certificates too)
        self.port = port
        self.store = Store(history_limit=history_limit)
        self._changes = Changes()
        self._watches = WatchHub(self.store, self._changes, bookmark_interval)
        self.store.listeners.append(lambda _event: self._changes.notify())
        self._faults = Faults(self.store, self._watches)
        self._tokens = TokenReviewer()
        self._router = Router(
            self.store,
            self._watches,
            self._faults,
            self._tokens,
            self._changes,
            address=lambda: f"{self.host}:{self.port}",
            require_token=require_token,
            extra_routes=extra_routes,
        )
        self._runner: web.AppRunner | None = None
        if system_namespaces:
            for name in SYSTEM_NAMESPACES:
                self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        """Listen (again) on host:port; the first start picks a free port if port is 0."""
        if self._runner is not None:
            return
        runner = web.AppRunner(
            self._router.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await runner.setup()
        site: web.BaseSite
        if self.sock is not None:
            site = web.SockSite(runner, self.sock, ssl_context=self.ssl_context)
        else:
            site = web.TCPSite(
                runner, self.host, self.port, reuse_address=True, ssl_context=self.ssl_context
            )
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

    # ------------------------------------------------------ configuration

    @property
    def bookmark_interval(self) -> float:
        """Seconds between the BOOKMARKs of a watch that allowed them."""
        return self._watches.bookmark_interval

    @bookmark_interval.setter
    def bookmark_interval(self, seconds: float) -> None:
        self._watches.bookmark_interval = seconds

    @property
    def require_token(self) -> str | None:
        """The bearer token every request must carry (None: no check)."""
        return self._router.require_token

    @require_token.setter
    def require_token(self, token: str | None) -> None:
        self._router.require_token = token

    @property
    def extra_routes(self) -> list[web.AbstractRouteDef]:
        """Routes served before the API's (extend before `start`)."""
        return self._router.extra_routes

    # ------------------------------------------------------- state for tests

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return str(self.store.rv)

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request received, in order."""
        return self._router.requests

    @property
    def open_watches(self) -> int:
        return self._watches.count()

    def open_watches_for(self, kind: str) -> int:
        return self._watches.count(resources.resource_type(kind))

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
        await self._changes.wait_until(predicate, timeout)

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
        return copy.deepcopy(objects.replace(self.store, _rtype_of(obj), obj))

    def apply(self, obj: Obj) -> Obj:
        """Create or unconditionally replace, by kind/namespace/name."""
        rtype = _rtype_of(obj)
        meta = obj.get("metadata") or {}
        if self.store.get(rtype, meta.get("namespace") or "", meta.get("name") or "") is None:
            return self.create(obj)
        return copy.deepcopy(objects.replace(self.store, rtype, obj, check_rv=False))

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

    # -------------------------------------------------------- fault switches

    def drop_watches(self, abrupt: bool = True) -> None:
        """End every open watch: abrupt cuts the connection (a crashed server),
        otherwise the body ends cleanly (a server-side watch timeout)."""
        self._faults.drop_watches(abrupt)

    def compact(self) -> None:
        """Forget history up to now: watching or paging from an older RV gets 410."""
        self._faults.compact()

    def expire_watches(self) -> None:
        """Compact, then end every open watch with a 410 Expired ERROR event."""
        self._faults.expire_watches()

    def fail_lists(self, n: int | None = None) -> None:
        """The next n list requests (all, if None, until fail_lists(0)) get 500."""
        self._faults.fail_lists(n)

    def throttle_lists(self, n: int | None, retry_after: str = "1") -> None:
        """The next n list requests (all, if None, until throttle_lists(0)) get 429 with
        that Retry-After."""
        self._faults.throttle_lists(n, retry_after)

    def hang(self, path_part: str | None) -> None:
        """Accept requests whose path contains `path_part` and never answer them (None:
        answer again)."""
        self._faults.hang(path_part)

    def drop(self, path_part: str, times: int = 1) -> None:
        """Close the connection, unanswered, on the next `times` requests whose path
        contains `path_part`."""
        self._faults.drop(path_part, times)

    def send_bookmarks(self) -> None:
        """A BOOKMARK now on every open watch that allowed bookmarks."""
        self._faults.send_bookmarks()

    def stream_raw(self, data: bytes, times: int = 1, kind: str | None = None) -> int:
        """Write `data` (`times` times over) as it is on every open watch (of `kind`), as
        a hostile API server would: garbage lines, a line that never ends. Returns how
        many watches got it; `raw_written` counts the bytes that went out."""
        rtype = resources.resource_type(kind) if kind else None
        return self._faults.stream_raw(data, times, rtype)

    @property
    def raw_written(self) -> int:
        """Bytes of `stream_raw` written so far (a client that hangs up stops them)."""
        return self._watches.raw_written

    # ---------------------------------------------------------------- tokens

    @property
    def tokens(self) -> dict[str, TokenIdentity]:
        """Bearer token -> the service account TokenReview maps it to."""
        return self._tokens.tokens

    @property
    def token_reviews(self) -> list[TokenReviewRecord]:
        """Every TokenReview answered, in order."""
        return self._tokens.reviews

    def add_service_account_token(
        self, namespace: str, service_account: str, audiences: Iterable[str] = ("istio-ca",)
    ) -> str:
        """A new opaque bearer token TokenReview will map to the service account."""
        return self._tokens.add_service_account_token(namespace, service_account, audiences)


def _rtype_of(obj: Obj) -> ResourceType:
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ValueError("object has no kind")
    return resources.resource_type(kind)
