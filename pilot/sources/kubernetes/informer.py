"""An informer: list, then watch from the list's resourceVersion, for one kind of object.

Semantics (those of client-go's reflector):
- List in pages; the list's resourceVersion is where the watch starts.
- Watch with bookmarks and a server-side timeout; when the server ends a watch,
  watch again from the last resourceVersion seen, without listing.
- On 410 Expired (from the watch request or an ERROR event), list again and hand
  the handler the *whole* state: it applies only the difference, so a relist
  never removes anything that still exists.
- On transport or server errors, retry with exponential backoff and jitter,
  keeping what was handed to the handler; `error` says what failed, until a list
  or a watch succeeds again.
- Objects are read as raw JSON (dicts); the handler does its own parsing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import aiohttp

from pilot.backoff import Backoff
from pilot.sources.kubernetes.config import InformerSettings

log = logging.getLogger("pilot.sources.kubernetes")

Obj = dict[str, Any]
# With _preload_content=False, the generated list functions return the raw response.
Request = Callable[..., Awaitable[Any]]
ObjectKey = tuple[str, str]


class InformerHandler(Protocol):
    """Receives the objects of one kind as they change."""

    def upsert(self, obj: Obj) -> None: ...

    def delete(self, namespace: str, name: str) -> None: ...


class Expired(Exception):
    """The resourceVersion is too old (410): list again."""


class ApiStatusError(Exception):
    """The API server answered with an error Status."""


def _key(obj: Obj) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


async def _json_body(response: aiohttp.ClientResponse, what: str) -> Obj:
    async with response:
        text = await response.text()
    if response.status == 410:
        raise Expired(what)
    if not 200 <= response.status < 300:
        raise ApiStatusError(f"{what}: HTTP {response.status}: {text[:300]}")
    body: Obj = json.loads(text)
    return body


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """Newline-delimited events, however large (an EndpointSlice can be big)."""
    buffer = bytearray()
    async for chunk in response.content.iter_any():
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if line.strip():
                yield line
    if buffer.strip():
        yield bytes(buffer)


class Informer:
    """Keeps a handler current with one kind of object; `synced` once the first list is in."""

    def __init__(
        self,
        kind: str,
        request: Request,
        handler: InformerHandler,
        settings: InformerSettings,
        label_selector: str = "",
    ) -> None:
        self.kind = kind
        self._request = request
        self._handler = handler
        self._settings = settings
        self._label_selector = label_selector
        self._resource_version = ""
        self._known: set[ObjectKey] = set()
        self.synced = asyncio.Event()
        self.relists = 0
        self.watch_restarts = 0
        self.error = ""  # the last failure, until the next list or watch gets an answer

    def inherit(self, previous: Informer) -> None:
        """Take over what `previous` (of the same kind) handed the handler: the first list
        then deletes what is gone, as a relist does, rather than leaving it behind."""
        self._known = set(previous._known)

    async def run(self) -> None:
        """Forever: list when needed, watch, recover from every failure."""
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
                    "%s: resourceVersion %s expired; relisting", self.kind, self._resource_version
                )
                need_list = True
            except (aiohttp.ClientError, TimeoutError, ApiStatusError, ValueError) as error:
                delay = backoff.next_delay()
                self.error = str(error) or type(error).__name__
                log.warning(
                    "%s: %s; retrying in %.1fs", self.kind, error or type(error).__name__, delay
                )
                await asyncio.sleep(delay)

    def _params(self, **extra: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"_preload_content": False, **extra}
        if self._label_selector:
            params["label_selector"] = self._label_selector
        return params

    async def _list(self) -> None:
        items: list[Obj] = []
        token = ""
        while True:
            params = self._params(
                limit=self._settings.page_size,
                _request_timeout=(self._settings.connect_timeout, 60.0),
            )
            if token:
                params["_continue"] = token
            body = await _json_body(await self._request(**params), f"list {self.kind}")
            for item in body.get("items") or []:
                item.setdefault("kind", self.kind)
                items.append(item)
            meta = body.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                break
        self._resource_version = str(meta.get("resourceVersion") or "")
        self.error = ""
        self._replace(items)
        if self.synced.is_set():
            self.relists += 1
        self.synced.set()
        log.info(
            "%s: listed %d at resourceVersion %s", self.kind, len(items), self._resource_version
        )

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
                raise ApiStatusError(f"watch {self.kind}: HTTP {response.status}")
            self.error = ""
            async for line in _lines(response):
                self._apply_event(json.loads(line))
                delivered = True
        self.watch_restarts += 1
        return delivered

    def _apply_event(self, event: Obj) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired(str(obj.get("message", "")))
            raise ApiStatusError(f"watch {self.kind}: {obj.get('message', obj)}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED"):
            self._known.add(_key(obj))
            self._handler.upsert(obj)
        elif kind == "DELETED":
            self._known.discard(_key(obj))
            self._handler.delete(*_key(obj))
        if version:
            self._resource_version = str(version)
