"""An informer: list, then watch from the list's resourceVersion, for one kind of object.

Semantics (those of client-go's reflector):
- List in pages; the list's resourceVersion is where the watch starts.
- Watch with bookmarks and a server-side timeout; when the server ends a watch,
  watch again from the last resourceVersion seen (an event's or a bookmark's:
  `bookmarks` counts those), without listing.
- On 410 Expired (from the watch request or an ERROR event), list again and hand
  the handler the *whole* state: it applies only the difference, so a relist
  never removes anything that still exists.
- On transport or server errors, retry with exponential backoff and jitter,
  keeping what was handed to the handler; `error` says what failed, until a list
  or a watch succeeds again. A 429 (the server asks to slow down, or its watch
  cache is still filling, as after a CRD is created) is retried after its
  `Retry-After` (at most 10 s; else the backoff) without failing, as client-go
  does, up to 10 in a row; then it fails as any other error. A refusal (401,
  403) is reported to `Refusals` (one warning per cluster while it lasts), any
  other failure in a warning each.
- Objects are read as raw JSON (dicts); the handler does its own parsing.

An API server is not trusted to be well-behaved (a remote cluster's may be
anyone's). One watch event (one line) and one list page are bounded
(`PILOT_MAX_WATCH_EVENT_BYTES`; a page may be four times that, and a page too
big is asked for again in smaller pages): a line past the bound ends the watch,
and the informer lists again after its backoff, so memory never grows with what
the server streams. A line that is not JSON, not a JSON object, an event of no
known type, whose object is not an object, is of another kind or has no name is
skipped, counted in `WatchFaults` by reason and logged (a line per informer per
10 s at most); skipping loses nothing an honest server sent. A list response
that is not an object, or whose items are not a list, fails that list (retried
with backoff); an item that is not an object of the kind with a name is skipped.
`synced` is true only while the first list is in and nothing is failing: not
while the watch is down, nor while the informer's task is failing (`run` raised)
and waits to be started again.

Shared by every cluster's informers: `Watching` (their supervisor, the
`WatchFaults` tally and `Refusals`) and `cluster_status`, the line `/ready` shows for a cluster.
This module needs no Kubernetes client, so pilot serving a file reads them too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from pilot.kube.config import InformerSettings
from pilot.kube.refusals import REFUSED, Refusals
from pilot.runtime.backoff import Backoff
from pilot.runtime.supervisor import Supervisor, describe, one_line

log = logging.getLogger("pilot.sources.kubernetes")

Obj = dict[str, Any]
# With _preload_content=False, the generated list functions return the raw response.
Request = Callable[..., Awaitable[Any]]
ObjectKey = tuple[str, str]

EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})
METADATA_KIND = "PartialObjectMetadata"  # what metadata-only lists and watches answer
PAGE_BYTES_FACTOR = 4  # a list page may hold this many of the largest events
LOG_EVERY = 10.0
_REASON_CHARS = 120  # of an informer's error, in `/ready`'s cluster line
_REFUSAL_CHARS = 400  # of an API server's refusal: a 403 names user, verb, resource, group


class InformerHandler(Protocol):
    """Receives the objects of one kind as they change."""

    def upsert(self, obj: Obj) -> None: ...

    def delete(self, namespace: str, name: str) -> None: ...


class Expired(Exception):
    """The resourceVersion is too old (410): list again."""


class ApiStatusError(Exception):
    """The API server answered with an error Status (`status`: its HTTP status, 0 for an
    ERROR event; `retry_after`: the seconds its Retry-After asks for, bounded)."""

    def __init__(self, message: str, status: int = 0, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


THROTTLED = 429
MAX_RETRY_AFTER = 10.0  # seconds: a longer Retry-After is taken as this
MAX_THROTTLED = 10  # 429s in a row retried without failing (client-go retries 10)


def retry_after(response: aiohttp.ClientResponse) -> float | None:
    """The seconds a response's Retry-After asks for (its integer form; the date form and
    nonsense: None), at most MAX_RETRY_AFTER."""
    value = response.headers.get("Retry-After", "").strip()
    if not value.isdigit():
        return None
    return MAX_RETRY_AFTER if len(value) > 6 else min(float(value), MAX_RETRY_AFTER)


class Malformed(Exception):
    """The API server answered something no API server may: counted under `reason`,
    then listed again after the backoff."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class PageTooLarge(Malformed):
    """A list page past its bound: ask for smaller pages."""


class WatchFaults:
    """What API servers sent wrong, by (cluster, kind, reason), for `/metrics`; and the
    log lines saying so, one per informer per LOG_EVERY seconds with a count."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self._clock = clock
        self._logged_at: dict[tuple[str, str], float] = {}
        self._quiet: Counter[tuple[str, str]] = Counter()

    def report(
        self, cluster: str, kind: str, reason: str, what: str, outcome: str = "skipped"
    ) -> None:
        self.counts[(cluster, kind, reason)] += 1
        informer, now = (cluster, kind), self._clock()
        last = self._logged_at.get(informer)
        if last is not None and now - last < LOG_EVERY:
            self._quiet[informer] += 1
            return
        quiet = self._quiet.pop(informer, 0)
        more = f" ({quiet} more since the last such line)" if quiet else ""
        where = f"cluster {cluster} {kind}" if cluster else kind
        log.warning("%s: the API server sent %s; %s%s", where, what, outcome, more)
        self._logged_at[informer] = now

    def forget(self, cluster: str) -> None:
        """A removed cluster's counts leave the metric."""
        for key in [key for key in self.counts if key[0] == cluster]:
            del self.counts[key]


@dataclass(frozen=True)
class Watching:
    """What the informers of every cluster share: the supervisor that runs them, the
    tally of what their API servers sent wrong, and which of them refuse pilot."""

    supervisor: Supervisor = field(default_factory=Supervisor)
    faults: WatchFaults = field(default_factory=WatchFaults)
    refusals: Refusals = field(default_factory=Refusals)


def cluster_status(informers: Sequence[Informer], synced: bool) -> str:
    """`synced`, `syncing`, or `unreachable: REASON` while its informers fail."""
    errors = [informer.error for informer in informers if informer.error]
    if errors:
        reason = " ".join(errors[0].split())
        return f"unreachable: {reason[:_REASON_CHARS]}"
    return "synced" if synced else "syncing"


def _key(obj: Obj) -> ObjectKey:
    meta = obj["metadata"]  # checked by `_object_problem` before any object gets here
    return str(meta.get("namespace") or ""), str(meta["name"])


async def _read_bounded(response: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise PageTooLarge("too_large", f"{what}: an answer over {limit} bytes")
    return bytes(body)


def _refusal(raw: bytes) -> str:
    """The `message` of a Kubernetes Status (a 403 names the user, verb and resource it
    lacks), else the answer's start; one bounded line either way."""
    text = raw[: _REFUSAL_CHARS * 4].decode("utf-8", errors="replace")
    try:
        status = json.loads(raw) if len(raw) <= _REFUSAL_CHARS * 4 else None
    except (ValueError, RecursionError):
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        text = status["message"]
    return one_line(text, _REFUSAL_CHARS)


async def _json_body(response: aiohttp.ClientResponse, what: str, limit: int) -> Obj:
    async with response:
        raw = await _read_bounded(response, limit, what)
    if response.status == 410:
        raise Expired(what)
    if not 200 <= response.status < 300:
        message = f"{what}: HTTP {response.status}: {_refusal(raw)}"
        raise ApiStatusError(message, response.status, retry_after(response))
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise Malformed("not_json", f"{what}: an answer that is not JSON") from None
    if not isinstance(body, dict):
        raise Malformed("not_object", f"{what}: an answer that is not a JSON object")
    return body


# The line so far: chunks of SMALL_CHUNK bytes or more are kept as they came, smaller
# ones gather in one buffer, kept whole once it holds GATHERED bytes.
SMALL_CHUNK = 4096
GATHERED = 64 * 1024


class LineSplitter:
    """Newline-delimited events out of a stream's chunks, none longer than `limit` bytes.

    The line so far is never one buffer grown in place to the limit (growing it can copy
    it: on uvloop a line that never ends once peaked at twice the limit), nor a list of
    every chunk (a server dripping one byte at a time would cost an object per byte).
    Chunks are kept as they came, and small ones gathered first (SMALL_CHUNK, GATHERED);
    so the line so far costs `limit` plus one chunk, with under 1% more for the pieces.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pieces: list[bytes] = []  # the line so far, then `_small`: no newline in them
        self._small = bytearray()
        self._held = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines `chunk` completes (blank ones left out); Malformed once one is too long."""
        lines, start = [], 0
        end = chunk.find(b"\n")
        while end >= 0:
            self._check(self._held + end - start)
            line = self._joined(chunk[start:end])
            if line.strip():
                lines.append(line)
            start = end + 1
            end = chunk.find(b"\n", start)
        if start < len(chunk):
            self._check(self._held + len(chunk) - start)
            self._keep(chunk[start:] if start else chunk)
        return lines

    def rest(self) -> bytes | None:
        """What followed the last newline, when the stream ended there (None: nothing)."""
        line = self._joined(b"")
        return line if line.strip() else None

    def _keep(self, data: bytes) -> None:
        self._held += len(data)
        if len(data) >= SMALL_CHUNK:
            self._keep_gathered()
            self._pieces.append(data)
            return
        self._small += data
        if len(self._small) >= GATHERED:
            self._keep_gathered()

    def _keep_gathered(self) -> None:
        if self._small:
            self._pieces.append(bytes(self._small))
            self._small = bytearray()

    def _joined(self, tail: bytes) -> bytes:
        if not self._held:
            return tail
        line = b"".join([*self._pieces, self._small, tail])
        self._pieces, self._small, self._held = [], bytearray(), 0
        return line

    def _check(self, length: int) -> None:
        if length > self._limit:
            raise Malformed(
                "too_large",
                f"a watch event over {self._limit} bytes (PILOT_MAX_WATCH_EVENT_BYTES)",
            )


async def _lines(response: aiohttp.ClientResponse, limit: int) -> AsyncIterator[bytes]:
    """Newline-delimited events of at most `limit` bytes (an EndpointSlice can be big);
    Malformed when one is longer, without holding more than `limit` plus one chunk."""
    splitter = LineSplitter(limit)
    async for chunk in response.content.iter_any():
        for line in splitter.feed(chunk):
            yield line
    rest = splitter.rest()
    if rest is not None:
        yield rest


def _metadata(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _type_name(value: object) -> str:
    return {dict: "object", list: "list", str: "string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


class Informer:
    """Keeps a handler current with one kind of object; `listed` once the first list is in."""

    def __init__(
        self,
        kind: str,
        request: Request,
        handler: InformerHandler,
        settings: InformerSettings,
        label_selector: str = "",
        *,
        cluster: str = "",
        faults: WatchFaults | None = None,
        refusals: Refusals | None = None,
    ) -> None:
        self.kind = kind
        self.cluster = cluster  # for log lines and metrics; "" for pilot's own watches
        self._request = request
        self._handler = handler
        self._settings = settings
        self._label_selector = label_selector
        self._page_size = settings.page_size
        self._faults = faults if faults is not None else WatchFaults()
        self._refusals = refusals if refusals is not None else Refusals()
        self._resource_version = ""
        self._known: set[ObjectKey] = set()
        self.listed = asyncio.Event()
        self.relists = 0
        self.watch_restarts = 0
        self.bookmarks = 0  # resume points the server sent without an object event
        self.error = ""  # the last failure, until the next list or watch gets an answer
        self._throttled = 0  # 429s in a row

    @property
    def synced(self) -> bool:
        """Listed, and neither its watch nor its task is failing now."""
        return self.listed.is_set() and not self.error

    @property
    def _where(self) -> str:
        return f"cluster {self.cluster} {self.kind}" if self.cluster else self.kind

    def inherit(self, previous: Informer) -> None:
        """Take over what `previous` (of the same kind) handed the handler: the first list
        then deletes what is gone, as a relist does, rather than leaving it behind."""
        self._known = set(previous._known)

    async def run(self) -> None:
        """Forever: list when needed, watch, recover from every failure. What it cannot
        recover from (a handler raising) escapes to whoever runs it, and until the next
        list succeeds `error` says so."""
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self.error = f"watch failed: {describe(error)}"
            raise

    async def _run(self) -> None:
        backoff = Backoff(self._settings.backoff_initial, self._settings.backoff_max)
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                if await self._watch():
                    backoff.reset()
            except Expired:
                log.info(
                    "%s: resourceVersion %s expired; relisting",
                    self._where,
                    self._resource_version,
                )
                need_list = True
            except Malformed as error:
                delay = backoff.next_delay()
                outcome = f"listing again in {delay:.1f}s"
                self._faults.report(self.cluster, self.kind, error.reason, str(error), outcome)
                self.error = str(error)
                need_list = True  # what was lost is only in a new list
                await asyncio.sleep(delay)
            except ApiStatusError as error:
                if error.status == THROTTLED and self._throttled < MAX_THROTTLED:
                    await self._slow_down(error, backoff)
                else:
                    await self._failed(error, backoff)
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                await self._failed(error, backoff)

    async def _slow_down(self, error: ApiStatusError, backoff: Backoff) -> None:
        """A 429: wait as the server asks (else the backoff) and retry, not failing."""
        self._throttled += 1
        delay = error.retry_after if error.retry_after is not None else backoff.next_delay()
        log.info(
            "%s: %s; the API server asks to wait, retrying in %.1fs", self._where, error, delay
        )
        await asyncio.sleep(delay)

    async def _failed(self, error: Exception, backoff: Backoff) -> None:
        delay = backoff.next_delay()
        self.error = one_line(str(error) or type(error).__name__, _REFUSAL_CHARS)
        if isinstance(error, ApiStatusError) and error.status in REFUSED:
            self._refusals.refused(self.cluster, self.kind, self.error, delay)
        else:
            log.warning("%s: %s; retrying in %.1fs", self._where, self.error, delay)
        await asyncio.sleep(delay)

    def _answered(self) -> None:
        """A list or a watch got an answer: nothing is failing now."""
        self.error = ""
        self._throttled = 0
        self._refusals.answered(self.cluster, self.kind)

    def _params(self, **extra: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"_preload_content": False, **extra}
        if self._label_selector:
            params["label_selector"] = self._label_selector
        return params

    async def _list(self) -> None:
        items: list[Obj] = []
        token = ""
        meta: Obj = {}
        while True:
            body = await self._list_page(token)
            if body is None:
                continue  # asked again in smaller pages
            raw_items = body.get("items")
            if raw_items is not None and not isinstance(raw_items, list):
                raise Malformed("bad_list", f"list {self.kind}: items that are not a list")
            for item in raw_items or ():
                if self._accepted(item, "a listed item"):
                    item.setdefault("kind", self.kind)
                    items.append(item)
            meta = _metadata(body)
            token = meta.get("continue") or ""
            if not isinstance(token, str):
                raise Malformed("bad_list", f"list {self.kind}: a continue token not a string")
            if not token:
                break
        self._resource_version = str(meta.get("resourceVersion") or "")
        self._answered()
        self._replace(items)
        if self.listed.is_set():
            self.relists += 1
        self.listed.set()
        log.info(
            "%s: listed %d at resourceVersion %s", self._where, len(items), self._resource_version
        )

    async def _list_page(self, token: str) -> Obj | None:
        """One page; None if it was too large and smaller pages are to be asked for."""
        params = self._params(
            limit=self._page_size,
            _request_timeout=(self._settings.connect_timeout, 60.0),
        )
        if token:
            params["_continue"] = token
        limit = self._settings.max_event_bytes * PAGE_BYTES_FACTOR
        try:
            return await _json_body(await self._request(**params), f"list {self.kind}", limit)
        except PageTooLarge:
            if self._page_size <= 1:
                raise
            self._page_size = max(1, self._page_size // 2)
            log.info(
                "%s: a list page over %d bytes; asking for pages of %d",
                self._where,
                limit,
                self._page_size,
            )
            return None

    def _replace(self, items: list[Obj]) -> None:
        """Apply a full state: upsert what is there, delete only what is gone."""
        present = {_key(item) for item in items}
        for item in items:
            self._handler.upsert(item)
        for namespace, name in self._known - present:
            self._handler.delete(namespace, name)
        self._known = present

    async def _watch(self) -> bool:
        """One watch, until the server ends it; True if it delivered anything."""
        timeout = self._settings.watch_timeout * random.uniform(1.0, 1.5)
        response = await self._request(
            **self._params(
                watch=True,
                resource_version=self._resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=int(timeout),
                _request_timeout=(self._settings.connect_timeout, timeout + 30),
            )
        )
        delivered = False
        async with response:
            if response.status == 410:
                raise Expired(self.kind)
            if not 200 <= response.status < 300:
                message = f"watch {self.kind}: HTTP {response.status}"
                raise ApiStatusError(message, response.status, retry_after(response))
            self._answered()
            async for line in _lines(response, self._settings.max_event_bytes):
                delivered = self._apply_line(line) or delivered
        self.watch_restarts += 1
        return delivered

    def _skip(self, reason: str, what: str) -> bool:
        self._faults.report(self.cluster, self.kind, reason, what)
        return False

    def _object_problem(self, obj: object) -> tuple[str, str] | None:
        """Why `obj` is no object of this informer's kind: (reason, what it is), or None."""
        if not isinstance(obj, dict):
            return "bad_object", f"an object that is a JSON {_type_name(obj)}"
        kind = obj.get("kind")
        if kind is not None and kind not in (self.kind, METADATA_KIND):
            return "wrong_kind", f"an object of kind {one_line(repr(kind), 60)}"
        meta = _metadata(obj)
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return "no_name", "an object without metadata.name"
        if not isinstance(meta.get("namespace") or "", str):
            return "no_name", "an object whose metadata.namespace is not a string"
        return None

    def _accepted(self, obj: object, where: str) -> bool:
        problem = self._object_problem(obj)
        if problem is not None:
            return self._skip(problem[0], f"{where}: {problem[1]}")
        return True

    def _apply_line(self, line: bytes) -> bool:
        """Apply one watch line; False if it was skipped (or a bookmark)."""
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            return self._skip("not_json", "a watch line that is not JSON")
        if not isinstance(event, dict):
            return self._skip("not_object", f"a watch event that is a JSON {_type_name(event)}")
        kind, obj = event.get("type"), event.get("object")
        if kind not in EVENT_TYPES:
            return self._skip("bad_type", f"a watch event of type {one_line(repr(kind), 60)}")
        if not isinstance(obj, dict):
            what = f"a {kind} event whose object is a JSON {_type_name(obj)}"
            return self._skip("bad_object", what)
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired(one_line(str(obj.get("message", ""))))
            raise ApiStatusError(f"watch {self.kind}: {one_line(str(obj.get('message', obj)))}")
        version = _metadata(obj).get("resourceVersion")
        if kind == "BOOKMARK":
            self.bookmarks += 1
            self._advance(version)
            return False
        if not self._accepted(obj, f"a {kind} event"):
            return False
        if kind == "DELETED":
            self._known.discard(_key(obj))
            self._handler.delete(*_key(obj))
        else:
            self._known.add(_key(obj))
            self._handler.upsert(obj)
        self._advance(version)
        return True

    def _advance(self, version: object) -> None:
        if isinstance(version, str | int) and version:
            self._resource_version = str(version)
