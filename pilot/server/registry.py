"""The connection registry: every live xDS stream of a server, closed at shutdown.

On SIGTERM the streams are closed at random moments spread over a window, so
that their Envoys reconnect to other replicas gradually rather than at once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Closable(Protocol):
    """A stream that can be asked to end."""

    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


class ConnectionRegistry(Generic[C]):
    """The live streams of one server."""

    def __init__(self) -> None:
        self._connections: set[C] = set()

    def add(self, connection: C) -> None:
        self._connections.add(connection)

    def discard(self, connection: C) -> None:
        self._connections.discard(connection)

    def __len__(self) -> int:
        return len(self._connections)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._connections))

    def close_all(self) -> None:
        """End every stream now."""
        for connection in list(self._connections):
            connection.close()

    async def drain(self, spread: float) -> None:
        """End every stream, at random moments within `spread` seconds."""
        connections = list(self._connections)
        random.shuffle(connections)
        step = spread / len(connections) if connections else 0.0
        for connection in connections:
            connection.close()
            if step:
                await asyncio.sleep(step)
