"""Waiting on the test API server's state: `Changes`.

Owns the wake-up signal behind `KubeAPIServer.wait_until`: the server pulses
it on every request, mutation and watch open/close, and a waiter re-checks its
predicate then (and every 50 ms, for predicates on state outside the server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

RECHECK_INTERVAL = 0.05


class Changes:
    """Something the server's state may have changed; waiters re-check."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        """Wake every waiter to re-check its predicate."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:  # noqa: ASYNC109
        """Until predicate() holds; TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while not predicate():
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    await asyncio.wait([waiter], timeout=RECHECK_INTERVAL)
                finally:
                    self._waiters.remove(waiter)
