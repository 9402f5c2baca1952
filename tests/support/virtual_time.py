"""An asyncio event loop on virtual time, for code whose behaviour is a matter of timing.

`run_in_virtual_time(main)` runs a coroutine on a `VirtualTimeLoop`: `loop.time()`
starts at 0 and moves only when every task is waiting on a timer, and then
straight to the earliest timer. So `asyncio.sleep`, `asyncio.wait_for` and
`asyncio.timeout` behave as on real time, in the same order, but take no real
time, and a test can say exactly when (in loop time) each thing happened.
Waiting for I/O is real (select without a timeout first); only the idle wait
for a timer is skipped. A loop with nothing to wait for at all is a deadlock,
and fails at once instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _SkippingSelector(selectors.DefaultSelector):
    """Reports ready I/O at once; where the loop would idle until a timer, moves the clock."""

    def __init__(self, clock: VirtualTimeLoop) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("deadlock: every task waits and no timer is set")
        self._clock.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose `time()` is virtual (see the module docstring)."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_SkippingSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(seconds, 0.0)


def run_in_virtual_time(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a fresh `VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
