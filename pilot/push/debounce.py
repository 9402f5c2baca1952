"""Istio's debounce: merge changes until the registry is quiet, but never wait too long.

A registry change (a PeerAuthentication or VirtualService change is one) opens a window. The
window closes when no change has arrived for `after` seconds, or `max_delay`
after it opened, whichever is first; everything that arrived meanwhile is
flushed as one merged `PushRequest`.
Some changes are not debounced: new certificates (each concerns one proxy,
there is nothing to merge and a proxy is waiting for it), and endpoint-only
changes when `eds_debounce` is off. They are flushed at once, without closing
an open window. Changes arriving while a flush runs wait for the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from pilot.push.request import PendingPush, PushRequest
from pilot.push.settings import DebounceSettings
from pilot.registry.index import IndexChange

log = logging.getLogger("pilot.push")

Flush = Callable[[PushRequest, float], None]

__all__ = ["DebounceSettings", "Debouncer", "Flush"]


class Debouncer:
    """Collects push requests and calls `flush(request, first_change_time)` when due."""

    def __init__(
        self, settings: DebounceSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._window = PendingPush()  # debounced: waits for quiet
        self._opened = 0.0
        self._last = 0.0
        self._now = PendingPush()  # flushed at once
        self._now_since = 0.0
        self._arrived = asyncio.Event()

    def submit(self, request: PushRequest) -> None:
        """Add a request: to the open window (opening one), or to what goes at once."""
        now = self._clock()
        registry = request.registry
        if registry and not self._debounces(registry):
            self._add_now(PushRequest(registry=registry), now)
            registry = IndexChange()
        if request.certificates:
            self._add_now(PushRequest(certificates=request.certificates), now)
        if registry or request.mtls_namespaces or request.routes:
            if not self._window:
                self._opened = now
            self._window.add(
                PushRequest(
                    registry=registry,
                    mtls_namespaces=request.mtls_namespaces,
                    routes=request.routes,
                )
            )
            self._last = now
        self._arrived.set()

    def take(self) -> tuple[PushRequest, float]:
        """Everything pending, now, without waiting (the initial state at start-up)."""
        request, since = self._take_now()
        window, opened = self._take_window()
        self._arrived.clear()
        return request.merge(window), min(since, opened, self._clock())

    async def run(self, flush: Flush) -> None:
        """Forever: wait until something is due, then flush it."""
        while True:
            await self._arrived.wait()
            await self._wait_until_due()
            request, since = self._take_due()
            if not request:
                continue
            try:
                flush(request, since)
            except Exception:
                log.exception("push failed; the next change rebuilds what it touches")

    def _debounces(self, change: IndexChange) -> bool:
        return self._settings.eds_debounce or bool(change.full)

    def _add_now(self, request: PushRequest, now: float) -> None:
        if not self._now:
            self._now_since = now
        self._now.add(request)

    def _deadline(self) -> float:
        return min(self._last + self._settings.after, self._opened + self._settings.max_delay)

    async def _wait_until_due(self) -> None:
        while not self._now and self._window:
            remaining = self._deadline() - self._clock()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()
            except TimeoutError:
                return

    def _take_due(self) -> tuple[PushRequest, float]:
        request, since = self._take_now()
        if self._window and self._clock() >= self._deadline():
            window, opened = self._take_window()
            request, since = request.merge(window), min(since, opened)
        if self._window:
            # Not due yet by our clock, though the loop's timer fired: a loop whose timers
            # read a coarser clock (uvloop's is in milliseconds) wakes a hair early. Wait
            # again for what is left, rather than for a change that may never come.
            self._arrived.set()
        else:
            self._arrived.clear()
        return request, since

    def _take_now(self) -> tuple[PushRequest, float]:
        since = self._now_since if self._now else float("inf")
        return self._now.take(), since

    def _take_window(self) -> tuple[PushRequest, float]:
        opened = self._opened if self._window else float("inf")
        return self._window.take(), opened
