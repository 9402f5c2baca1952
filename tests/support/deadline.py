"""`bounded(awaitable, seconds)`: an await with a deadline that never eats a cancellation.

The tests' `asyncio.wait_for`. On Python 3.11, `asyncio.wait_for` swallows a
cancellation that arrives as its inner await finishes: a loop cancelled at that
moment (a prober, a watch's writer) runs on, and whoever waits for it to end waits
for ever. `asyncio.timeout` has no such race, and this is it in the shape of the call
it replaces. pilot's own code uses `asyncio.timeout` directly (ruff bans `wait_for`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def bounded(awaitable: Awaitable[T], seconds: float) -> T:
    """`await awaitable`, or TimeoutError after `seconds` (the awaitable cancelled)."""
    async with asyncio.timeout(seconds):
        return await awaitable
