"""A subprocess read from outside: its stderr kept line by line, and stopped with SIGTERM.

`StderrLog` reads the process's stderr in the background, parsing each line as it
arrives, and lets a test wait for the next one with a deadline; `terminate` sends
SIGTERM and waits (killing the process if it does not exit in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import Generic, TypeVar

L = TypeVar("L")


class StderrLog(Generic[L]):
    """Every line a process wrote to stderr, parsed, kept in order."""

    def __init__(
        self, process: asyncio.subprocess.Process, parse: Callable[[str], L], name: str
    ) -> None:
        assert process.stderr is not None
        self.lines: list[L] = []
        self.ended = False  # stderr closed: the process exited
        self._parse = parse
        self._arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read(process.stderr), name=name)

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.lines.append(self._parse(line.decode(errors="replace").rstrip("\n")))
            self._arrived.set()
        self.ended = True
        self._arrived.set()

    async def next_line(self, within: float) -> None:
        """Until another line arrives or stderr closes, for at most `within` seconds."""
        self._arrived.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._arrived.wait()

    async def finished(self) -> None:
        """Until everything the process wrote has been read."""
        await self._reader


async def terminate(
    process: asyncio.subprocess.Process, stderr: StderrLog[L], within: float
) -> bool:
    """SIGTERM, then wait; True if the process exited in time (else it is killed)."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(within):
            await process.wait()
            await stderr.finished()
    except TimeoutError:
        process.kill()
        await process.wait()
        return False
    return True
