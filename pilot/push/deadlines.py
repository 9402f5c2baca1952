"""The send timeout of every stream's write in flight, kept by one timer.

A write that outlives PILOT_XDS_SEND_TIMEOUT ends its stream. A timer of its
own for each write cost a `call_later` and its cancel on every response
written: a handle made, pushed on the loop's heap and taken off again, for a
timeout that almost never fires. Every write of a port shares one timeout, so
writes start in the order they expire: `WriteDeadlines` keeps them in that
order and has one timer, due when the oldest write in flight expires.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable

TimedOut = Callable[[], None]


class WriteDeadlines:
    """Writes in flight by who is writing, oldest first; one timer for all of them."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        # Insertion order is expiry order: one timeout for all, and the loop's clock
        # never goes back. A writer's entry goes when its write ends.
        self._writing: dict[Hashable, tuple[float, TimedOut]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._writing)

    def started(self, writer: Hashable, timed_out: TimedOut) -> None:
        """`writer` began a write: `timed_out()` unless `ended(writer)` comes in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        self._writing.pop(writer, None)  # an update would keep the old place in the order
        self._writing[writer] = (deadline, timed_out)
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)

    def ended(self, writer: Hashable) -> None:
        """`writer`'s write landed or failed. The timer stays: when it is due, it finds
        the oldest write still in flight and waits for that one."""
        self._writing.pop(writer, None)

    def _expire(self) -> None:
        """End the writes past their deadline; wait for the next one due, if any."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._writing:
            writer, (deadline, timed_out) = next(iter(self._writing.items()))
            if deadline > now:
                self._timer = loop.call_at(deadline, self._expire)
                return
            del self._writing[writer]
            timed_out()
