"""Istio's debounce: merge changes until the registry is quiet, but never wait too long.

A change opens a window. The window closes when no change has arrived for
`after` seconds, or `max_delay` after it opened, whichever is first; everything
that arrived meanwhile is flushed as one merged `IndexChange`. With
`eds_debounce` off, endpoint-only changes are flushed at once. Changes arriving
while a flush runs wait for the next window, merged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pilot.registry.index import NO_CHANGE, IndexChange

log = logging.getLogger("pilot.push")


@dataclass(frozen=True, slots=True)
class DebounceSettings:
    """PILOT_DEBOUNCE_AFTER, PILOT_DEBOUNCE_MAX and PILOT_ENABLE_EDS_DEBOUNCE."""

    after: float = 0.1
    max_delay: float = 10.0
    eds_debounce: bool = True


Flush = Callable[[IndexChange, float], None]


class Debouncer:
    """Collects index changes and calls `flush(change, first_change_time)` per window."""

    def __init__(
        self,
        flush: Flush,
        settings: DebounceSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._flush = flush
        self._settings = settings
        self._clock = clock
        self._pending = NO_CHANGE
        self._opened = 0.0
        self._last = 0.0
        self._arrived = asyncio.Event()

    def submit(self, change: IndexChange) -> None:
        """Add a change to the open window (opening one if needed)."""
        if not change:
            return
        now = self._clock()
        if not self._pending:
            self._opened = now
        self._pending = self._pending.merge(change)
        self._last = now
        self._arrived.set()

    def take(self) -> tuple[IndexChange, float]:
        """Everything pending, now, without waiting (the initial state at start-up)."""
        change, opened = self._pending, self._opened
        self._pending = NO_CHANGE
        self._arrived.clear()
        return change, opened

    async def run(self) -> None:
        """Forever: wait for a window to close, then flush it."""
        while True:
            await self._arrived.wait()
            await self._wait_for_quiet()
            change, opened = self.take()
            try:
                self._flush(change, opened)
            except Exception:
                log.exception("push failed; the next change rebuilds what it touches")

    def _skips_debounce(self) -> bool:
        return not self._settings.eds_debounce and not self._pending.full

    async def _wait_for_quiet(self) -> None:
        while not self._skips_debounce():
            deadline = min(
                self._last + self._settings.after, self._opened + self._settings.max_delay
            )
            remaining = deadline - self._clock()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return
