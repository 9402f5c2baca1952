"""What the machine has only once, taken in turn by tests in parallel workers.

`held(name)` holds an exclusive lock (flock on a file in the temporary directory)
while its block runs: a test module that binds the Quick start's fixed ports
(15000, 15010, 15012, 15014) holds "quick-start-ports", so two workers never
start the README's pilot at once; a test module's Docker engine holds "docker-engine"
(every engine uses one data root). The lock goes with the process, however it ends.
`held_async` is the same for a coroutine: it waits without stopping the event loop.
"""

from __future__ import annotations

import asyncio
import fcntl
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

QUICK_START_PORTS = "quick-start-ports"
DOCKER_ENGINE = "docker-engine"


@contextmanager
def held(name: str) -> Iterator[None]:
    """Hold the machine-wide lock `name` (waiting for it) for the block."""
    path = Path(tempfile.gettempdir()) / f"pilot-tests-{name}.lock"
    with path.open("a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


@asynccontextmanager
async def held_async(name: str) -> AsyncIterator[None]:
    """`held`, waiting for the lock in a thread so that the event loop keeps running
    (the lock is the open file's, whichever thread took it)."""
    path = Path(tempfile.gettempdir()) / f"pilot-tests-{name}.lock"
    with path.open("a") as file:
        await asyncio.to_thread(fcntl.flock, file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)
