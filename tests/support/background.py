"""A loop that runs in the background for the length of an `async with` block."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self


class BackgroundLoop:
    """Subclasses define `_run()`; if it crashes, leaving the block fails the test."""

    what = "background loop"
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run(), name=self.what)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._task is not None
        failed = self._task.done() and not self._task.cancelled() and self._task.exception()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if failed and exc_type is None:
            raise AssertionError(f"the {self.what} failed: {failed!r}") from failed
