"""A process a test runs in the background: the lines it writes, waiting for one, stopping it.

`LineLog` reads one of the process's streams in the background, parsing each line as
it arrives, and lets a test wait for the next one with a deadline. `terminate` is the
one stop policy: SIGTERM, wait (for the exit and, if given, for everything the process
wrote to be read), then SIGKILL if it did not exit in time. `BackgroundProcess` is the
base of the harness's running processes (pilot, `pilot agent`, a process in a pod):
the asyncio subprocess and its line log, `until` and `wait_for` a line with a deadline
(failing with the process's last lines), `tail`, and `terminate`. Envoy's harness
writes its log to a file instead and shares only `terminate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Generic, TypeVar

import pytest

L = TypeVar("L")
T = TypeVar("T")


class LineLog(Generic[L]):
    """Every line a process wrote to one stream, parsed, kept in order."""

    def __init__(
        self, stream: asyncio.StreamReader | None, parse: Callable[[str], L], name: str
    ) -> None:
        assert stream is not None, "the stream must be a pipe"
        self.lines: list[L] = []
        self.ended = False  # the stream closed: the process exited
        self._parse = parse
        self._arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read(stream), name=name)

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.lines.append(self._parse(line.decode(errors="replace").rstrip("\n")))
            self._arrived.set()
        self.ended = True
        self._arrived.set()

    async def next_line(self, within: float) -> None:
        """Until another line arrives or the stream closes, for at most `within` seconds."""
        self._arrived.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._arrived.wait()

    async def finished(self) -> None:
        """Until everything the process wrote has been read."""
        await self._reader


async def terminate(
    process: asyncio.subprocess.Process, log: LineLog[L] | None, within: float
) -> bool:
    """SIGTERM, then wait for the exit (and for `log` to be read to its end); True if
    that took less than `within` seconds, else the process is killed."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(within):
            await process.wait()
            if log is not None:
                await log.finished()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return False
    return True


@dataclass
class BackgroundProcess(Generic[L]):
    """A running subprocess and every line it wrote to the stream `output` reads."""

    process: asyncio.subprocess.Process
    output: LineLog[L] = field(repr=False)

    tail_heading: ClassVar[str] = "its last log lines"

    @property
    def lines(self) -> list[L]:
        return self.output.lines

    @property
    def ended(self) -> bool:
        """Its output closed: the process exited."""
        return self.output.ended

    async def until(self, found: Callable[[], T | None], within: float) -> T | None:
        """`found()` once it is true; None after `within` seconds or once the output ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not (result := found()):
            remaining = deadline - loop.time()
            if remaining <= 0 or self.output.ended:
                return None
            await self.output.next_line(remaining)
        return result

    async def wait_for(self, found: Callable[[], T | None], failure: str, within: float) -> T:
        """`found()` once it is true, or fail the test: `failure`, when, and the tail."""
        result = await self.until(found, within)
        if result is None:
            when = "before it exited" if self.output.ended else f"within {within:g}s"
            pytest.fail(f"{failure} {when}; {self.tail()}")
        return result

    def shown(self, line: L) -> str:
        """One line as `tail` shows it."""
        return str(line)

    def tail(self, count: int = 8) -> str:
        shown = [self.shown(line) for line in self.lines[-count:]]
        return f"{self.tail_heading}:\n  " + "\n  ".join(shown)

    async def terminate(self, within: float, drain: bool = True) -> bool:
        """`terminate` this process, waiting for its output to be read unless `drain`
        is False; True if it exited within `within` seconds."""
        return await terminate(self.process, self.output if drain else None, within)
