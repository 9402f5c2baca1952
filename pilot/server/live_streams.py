"""The live streams: every live xDS stream of a server, counted, closed at shutdown.

Streams are counted in all and per peer (one HTTP/2 connection), for the limits.

On SIGTERM the streams are closed at random moments spread over a window, so
that their Envoys reconnect to other replicas gradually rather than at once.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Closable(Protocol):
    """A stream that can be asked to end, and the connection (peer) it came on."""

    @property
    def peer(self) -> str: ...

    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


class LiveStreams(Generic[C]):
    """The live streams of one server."""

    def __init__(self) -> None:
        self._connections: set[C] = set()
        self._by_peer: Counter[str] = Counter()

    def add(self, connection: C) -> None:
        if connection not in self._connections:
            self._connections.add(connection)
            self._by_peer[connection.peer] += 1

    def discard(self, connection: C) -> None:
        if connection in self._connections:
            self._connections.discard(connection)
            self._by_peer[connection.peer] -= 1
            if not self._by_peer[connection.peer]:
                del self._by_peer[connection.peer]

    def on_peer(self, peer: str) -> int:
        """Live streams on one HTTP/2 connection (gRPC's peer names the connection)."""
        return self._by_peer.get(peer, 0)

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
