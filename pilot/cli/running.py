"""Running a server until SIGINT or SIGTERM, which stop it at any moment, while it starts
too."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("pilot")


class _Server(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def run_until_signalled(server: _Server, starting: Callable[[], str]) -> None:
    """Start `server`, run it until SIGINT or SIGTERM, then stop it.

    A signal stops it at any moment, while it starts too: `start` waits for the
    registry's first full state, which a missing or broken file never gives, and
    Ctrl-C must still work then. `starting()` says what a start cut short was at.
    """
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()

    def on_signal(signum: signal.Signals) -> None:
        if not received.done():
            received.set_result(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    started = asyncio.create_task(server.start(), name="start")
    either: set[asyncio.Future[Any]] = {started, received}
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if started.done():
        if started.exception() is not None:
            await server.stop()  # close what did start: left to the collector, grpc complains
        started.result()  # a start that failed raises here (a one-line error in main)
        log.info("stopping on %s", (await received).name)
    else:
        log.info("stopping on %s %s", received.result().name, starting())
        started.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await started
    await server.stop()
