"""A long-running process in a pod (tests/support/pods): started, awaited, stopped.

`running_in(pod, argv, ready)` starts `argv` in the pod (as `uid` if given) and
returns once a line of its stdout or stderr contains `ready`, with a deadline;
its lines are kept (`lines`). On the way out it is sent SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.deadline import bounded
from tests.support.pods import Pod

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


@dataclass
class PodProcess:
    """A process in a pod and every line it printed (stdout and stderr together)."""

    process: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
            self.changed.set()
        self.ended = True
        self.changed.set()

    def tail(self, count: int = 15) -> str:
        return "its last lines:\n  " + "\n  ".join(self.lines[-count:])

    async def wait_line(self, text: str, within: float = START_TIMEOUT) -> str:
        """The first line containing `text`, once there is one (or fail)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            found = next((line for line in self.lines if text in line), None)
            if found is not None:
                return found
            remaining = deadline - loop.time()
            if remaining <= 0 or self.ended:
                when = "before it exited" if self.ended else f"within {within:g}s"
                pytest.fail(f"no line with {text!r} {when}; {self.tail()}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await bounded(self.changed.wait(), remaining)

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await bounded(self.process.wait(), STOP_TIMEOUT)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        assert self.process.returncode is not None
        return self.process.returncode


@asynccontextmanager
async def running_in(
    pod: Pod,
    argv: Sequence[str],
    ready: str,
    *,
    uid: int | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[PodProcess]:
    process = await asyncio.create_subprocess_exec(
        *pod.command(*argv, uid=uid),
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    running = PodProcess(process)
    reader = asyncio.create_task(running._read())
    try:
        await running.wait_line(ready)
        yield running
    finally:
        await running.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
