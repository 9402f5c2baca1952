"""A long-running process in a pod (tests/support/pods): started, awaited, stopped.

`running_in(pod, argv, ready)` starts `argv` in the pod (as `uid` if given) and
returns once a line of its stdout or stderr contains `ready`, with a deadline;
its lines are kept (`lines`). On the way out it is sent SIGTERM, then SIGKILL.
The process, its lines and the stop policy are tests/support/background_process's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tests.support.background_process import BackgroundProcess, LineLog
from tests.support.pods import Pod

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


@dataclass
class PodProcess(BackgroundProcess[str]):
    """A process in a pod and every line it printed (stdout and stderr together)."""

    tail_heading: ClassVar[str] = "its last lines"

    def tail(self, count: int = 15) -> str:
        return super().tail(count)

    async def wait_line(self, text: str, within: float = START_TIMEOUT) -> str:
        """The first line containing `text`, once there is one (or fail)."""

        def found() -> str | None:
            return next((line for line in self.lines if text in line), None)

        return await self.wait_for(found, f"no line with {text!r}", within)

    async def stop(self) -> int:
        await self.terminate(STOP_TIMEOUT, drain=False)
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
    running = PodProcess(process, LineLog(process.stdout, str, "pod-output"))
    try:
        await running.wait_line(ready)
        yield running
    finally:
        await running.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await running.output.finished()
