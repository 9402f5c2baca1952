"""The open watch streams of the test API server: `WatchHub`.

Owns the watch half of the list/watch protocol: opening a watch at a
resourceVersion (replaying history since then, or the current state first),
showing each store event through the watcher's selectors the way the watch
cache does, BOOKMARKs (periodic, on demand, and the initial-events-end one),
streaming JSON lines over chunked HTTP until `timeoutSeconds` (whole objects,
or each reshaped, e.g. to its metadata), and ending the streams on purpose:
cleanly, abruptly, or with a 410 Expired ERROR event. A hostile server's bytes
too: `Raw` data written on open watches as it is (garbage lines, a line that
never ends), counted in `raw_written`.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from .changes import Changes
from .resources import ResourceType
from .selectors import Selector
from .store import ApiError, Event, Obj, Store, too_large, with_rv
from .wire import JSON, Target, parse_bool, parse_int, query_selector

INITIAL_EVENTS_END = {"k8s.io/initial-events-end": "true"}


@dataclass(frozen=True)
class Raw:
    """Bytes a hostile server writes on a watch as they are, `times` times over (so that
    64 MB can be streamed from a 1 MB chunk without holding 64 MB)."""

    data: bytes
    times: int = 1


class Control(enum.Enum):
    """How a watch stream ends, once the events queued before it are written."""

    END = "end"  # finish the response body cleanly
    ABORT = "abort"  # cut the connection


@dataclass(frozen=True)
class WatchParams:
    """The query parameters of a watch request."""

    resource_version: int | None  # None: start with the current state
    send_initial: bool
    bookmarks: bool
    timeout: float | None

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> WatchParams:
        rv = parse_int(query.get("resourceVersion"), "resourceVersion")
        timeout = parse_int(query.get("timeoutSeconds"), "timeoutSeconds")
        return cls(
            resource_version=rv or None,
            send_initial=parse_bool(query.get("sendInitialEvents"), "sendInitialEvents"),
            bookmarks=parse_bool(query.get("allowWatchBookmarks"), "allowWatchBookmarks"),
            timeout=float(timeout) if timeout and timeout > 0 else None,
        )


@dataclass(eq=False)
class Watch:
    """One open watch stream: what it selects and the lines queued for it."""

    rtype: ResourceType
    selector: Selector
    bookmarks: bool
    last_rv: int
    queue: asyncio.Queue[bytes | Control | Raw] = field(default_factory=asyncio.Queue)
    shape: Callable[[Obj], Obj] | None = None  # what is sent of each object (None: all of it)

    def offer(self, event: Event, lines: dict[str, bytes] | None = None) -> None:
        """Queue what this watch sees of event; `lines` caches the encoding of
        event.obj per event type across the watches of one event."""
        projected = project_event(event, self.selector)
        if projected is None:
            return
        event_type, obj = projected
        if lines is None or obj is not event.obj or self.shape is not None:
            self.push(event_type, obj)
            return
        if event_type not in lines:
            lines[event_type] = event_line(event_type, obj)
        self.last_rv = max(self.last_rv, event.rv)
        self.queue.put_nowait(lines[event_type])

    def push(self, event_type: str, obj: Obj) -> None:
        self.last_rv = max(self.last_rv, int(obj["metadata"]["resourceVersion"]))
        self.queue.put_nowait(event_line(event_type, self.shape(obj) if self.shape else obj))

    def push_bookmark(self, rv: int, annotations: dict[str, str] | None = None) -> None:
        meta: Obj = {"resourceVersion": str(rv)}
        if annotations:
            meta["annotations"] = annotations
        obj = {"kind": self.rtype.kind, "apiVersion": self.rtype.api_version, "metadata": meta}
        self.last_rv = max(self.last_rv, rv)
        self.queue.put_nowait(event_line("BOOKMARK", self.shape(obj) if self.shape else obj))

    def fail(self, error: ApiError) -> None:
        """End the stream with an ERROR event carrying error's Status."""
        self.queue.put_nowait(event_line("ERROR", error.status()))
        self.queue.put_nowait(Control.END)


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


class WatchHub:
    """Every open watch; fed by the store, drained into HTTP responses."""

    def __init__(self, store: Store, changes: Changes, bookmark_interval: float) -> None:
        self.store = store
        self.changes = changes
        self.bookmark_interval = bookmark_interval
        self._watches: set[Watch] = set()
        self.raw_written = 0  # bytes of `Raw` written to watches (a peer that hangs up stops it)
        store.listeners.append(self._on_event)

    def count(self, rtype: ResourceType | None = None) -> int:
        """Open watches (of rtype, if given)."""
        return sum(1 for w in self._watches if rtype is None or w.rtype == rtype)

    def _on_event(self, event: Event) -> None:
        lines: dict[str, bytes] = {}
        for watch in self._watches:
            if watch.rtype == event.rtype:
                watch.offer(event, lines)

    # ---------------------------------------------------------- ending them

    def end_all(self, abrupt: bool) -> None:
        """End every open watch: abrupt cuts the connection (a crashed server),
        otherwise the body ends cleanly (a server-side watch timeout)."""
        control = Control.ABORT if abrupt else Control.END
        for watch in self._watches:
            watch.queue.put_nowait(control)
        self._forget_all()

    def expire_all(self) -> None:
        """End every open watch with a 410 Expired ERROR event (after a compaction)."""
        for watch in self._watches:
            watch.fail(
                ApiError(
                    410,
                    "Expired",
                    f"too old resource version: {watch.last_rv} ({self.store.compacted_rv})",
                )
            )
        self._forget_all()

    def stream_raw(self, raw: Raw, rtype: ResourceType | None = None) -> int:
        """Write `raw` on every open watch (of rtype, if given); how many there were."""
        chosen = [w for w in self._watches if rtype is None or w.rtype == rtype]
        for watch in chosen:
            watch.queue.put_nowait(raw)
        return len(chosen)

    def bookmark_all(self) -> None:
        """A BOOKMARK now on every open watch that allowed bookmarks."""
        for watch in self._watches:
            if watch.bookmarks:
                watch.push_bookmark(self.store.rv)

    def _forget_all(self) -> None:
        """Ended watches stop counting (and receiving) at once, not when their
        handler gets round to closing the stream."""
        self._watches.clear()
        self.changes.notify()

    # ---------------------------------------------------------- serving one

    async def serve(
        self,
        request: web.Request,
        target: Target,
        shape: Callable[[Obj], Obj] | None = None,
    ) -> web.StreamResponse:
        """Answer a watch request: a chunked stream of JSON event lines (objects as `shape`d)."""
        watch, timeout = self._open(target, request.query, shape)
        try:
            response = web.StreamResponse(headers={"Content-Type": JSON})
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
            self.changes.notify()

    def _open(
        self, target: Target, query: Mapping[str, str], shape: Callable[[Obj], Obj] | None
    ) -> tuple[Watch, float | None]:
        """Build the watch with its first events queued, and register it unless
        it can only answer an error. Synchronous, so no change slips between
        the initial state and the live events."""
        params = WatchParams.parse(query)
        selector = query_selector(query, target)
        watch = Watch(target.rtype, selector, params.bookmarks, self.store.rv, shape=shape)
        try:
            self._queue_start(watch, params)
        except ApiError as error:
            watch.fail(error)
            return watch, params.timeout
        self._watches.add(watch)
        self.changes.notify()
        return watch, params.timeout

    def _queue_start(self, watch: Watch, params: WatchParams) -> None:
        if params.resource_version is None or params.send_initial:
            self._queue_current_state(watch, params)
            return
        watch.last_rv = params.resource_version
        for event in self.store.events_since(watch.rtype, params.resource_version):
            watch.offer(event)

    def _queue_current_state(self, watch: Watch, params: WatchParams) -> None:
        """ADDED for every selected object, then (sendInitialEvents) the end bookmark."""
        if params.resource_version is not None and params.resource_version > self.store.rv:
            raise too_large(params.resource_version, self.store.rv)
        for obj in self.store.items(watch.rtype):
            if watch.selector.matches(obj):
                watch.push("ADDED", obj)
        watch.last_rv = self.store.rv
        if params.send_initial and params.bookmarks:
            watch.push_bookmark(self.store.rv, INITIAL_EVENTS_END)

    async def _pump(
        self, watch: Watch, response: web.StreamResponse, duration: float | None
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
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the
                # cancellation that ends this watch when the server stops.
                async with asyncio.timeout(max(0.0, wake - now)):
                    first = await watch.queue.get()
            except TimeoutError:
                continue
            chunk, control = _drain(watch.queue, first)
            if chunk:
                await response.write(chunk)
            if isinstance(control, Raw):
                for _ in range(control.times):
                    await response.write(control.data)
                    self.raw_written += len(control.data)
            elif control is not None:
                return control is Control.END


def _drain(
    queue: asyncio.Queue[bytes | Control | Raw], first: bytes | Control | Raw
) -> tuple[bytes, Control | Raw | None]:
    """`first` and whatever else is queued, up to the first control or raw item."""
    lines: list[bytes] = []
    item: bytes | Control | Raw | None = first
    while item is not None:
        if isinstance(item, Control | Raw):
            return b"".join(lines), item
        lines.append(item)
        item = queue.get_nowait() if not queue.empty() else None
    return b"".join(lines), None
