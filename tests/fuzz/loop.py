"""An event loop on a thread of its own, so that synchronous Hypothesis tests can drive it.

Hypothesis calls a test once per example, synchronously. The pilot process, its log
reader, the `/ready` prober's reader and every aio channel live on this loop and keep
running between examples; each example is a coroutine handed over with `run`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """A running event loop on a daemon thread; `run` a coroutine on it, `close` at the end."""

    def __init__(self, name: str = "fuzz-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coroutine` on the loop and wait for its result (cancelled after `timeout`)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        """Cancel what is left on the loop, stop it and join the thread."""
        if self.loop.is_closed():
            return
        self.run(_cancel_others(), timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _cancel_others() -> None:
    current = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not current]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
