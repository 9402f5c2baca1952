"""`python -m bench.floor`: a bare grpc.aio DeltaAggregatedResources server, the bench's floor.

It does the least an xDS server must: it reads every request (parsing it for
its subscriptions, ignoring ACKs), keeps which streams subscribe to which
assignment, and writes pre-built bytes. The bytes are the ones pilot sent to one
of its clients in the same run:

- `--initial FILE`: the responses of a stream's initial sync, replayed by type
  when a stream first subscribes to that type: clusters (`*`), assignments, and
  for sidecars listeners (`*`) and route configurations;
- `--changes FILE`: responses to write on a trigger, in order; the standard
  input line `K` (or `K L ...`) writes response K (then L, ...) to every
  stream subscribed to what it carries, by name or by wildcard, or, when none
  is (new clusters' assignments, before anyone could ask), to every stream.

Prints `floor listening on PORT` once serving; stops when standard input
closes or on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from bench import wire
from pilot.runtime import event_loop

# Pilot's transport options (pilot.server.grpc_server), its default stream limit included:
# up to that many new streams wait in gRPC core's queue instead of being dropped past 1,000.
_PENDING = 20_000
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", 1 << 24),
    ("grpc.server.max_pending_requests", _PENDING),
    ("grpc.server.max_pending_requests_hard_limit", _PENDING),
]


class FloorStream:
    """One client stream: its pending writes and the types it was sent the initial state of."""

    __slots__ = ("queue", "sent")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.sent: set[str] = set()


class Floor:
    """Subscriptions per assignment name, and the pre-built bytes to write."""

    def __init__(self, initial: list[bytes], changes: list[bytes]) -> None:
        self.initial: dict[str, list[bytes]] = {}
        for raw in initial:
            self.initial.setdefault(wire.DeltaResponse.FromString(raw).type_url, []).append(raw)
        self.changes = [_keys(raw) for raw in changes]
        self.subscribers: dict[tuple[str, str], set[FloorStream]] = {}  # (type, name or *)
        self.streams: set[FloorStream] = set()

    async def handle(self, requests: AsyncIterator[bytes], context: Any) -> None:
        """Serve one stream: a reader task keeps subscriptions; this coroutine writes."""
        stream = FloorStream()
        self.streams.add(stream)
        reader = asyncio.create_task(self._read(stream, requests))
        try:
            while (data := await stream.queue.get()) is not None:
                await context.write(data)
        finally:
            reader.cancel()
            self.streams.discard(stream)
            for holders in self.subscribers.values():
                holders.discard(stream)

    async def _read(self, stream: FloorStream, requests: AsyncIterator[bytes]) -> None:
        try:
            async for raw in requests:
                request = wire.DeltaRequest.FromString(raw)
                if request.resource_names_subscribe:
                    self._subscribe(stream, request)
        finally:
            stream.queue.put_nowait(None)

    def _subscribe(self, stream: FloorStream, request: wire.DeltaRequest) -> None:
        kind = request.type_url
        for name in request.resource_names_subscribe:
            self.subscribers.setdefault((kind, sys.intern(name)), set()).add(stream)
        if kind not in stream.sent:
            stream.sent.add(kind)
            self._send(stream, self.initial.get(kind, []))

    @staticmethod
    def _send(stream: FloorStream, responses: list[bytes]) -> None:
        for raw in responses:
            stream.queue.put_nowait(raw)

    def push(self, index: int) -> None:
        """Write response `index` to the streams subscribed to what it carries."""
        keys, raw = self.changes[index]
        targets: set[FloorStream] = set()
        for key in keys:
            targets |= self.subscribers.get(key, set())
        for stream in targets or self.streams:
            stream.queue.put_nowait(raw)


def _keys(raw: bytes) -> tuple[list[tuple[str, str]], bytes]:
    """What a response carries, as subscriptions name it (its wildcard included), and it."""
    response = wire.DeltaResponse.FromString(raw)
    kind = response.type_url
    return [(kind, "*"), *((kind, r.name) for r in response.resources)], raw


async def _triggers(floor: Floor) -> None:
    """Push on each line of standard input, until it closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        for index in line.split():
            floor.push(int(index))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--initial", type=Path, required=True)
    parser.add_argument("--changes", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    return parser.parse_args(argv)


async def start_ads_floor(
    handle: Callable[..., Awaitable[None]],
    address: str,
    others: Sequence[grpc.GenericRpcHandler] = (),
) -> grpc.aio.Server:
    """A grpc.aio server with pilot's transport options whose DeltaAggregatedResources is
    `handle` (bytes in, bytes out), and `others` beside it, started on `address`; prints
    `floor listening on PORT`."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    handler = grpc.stream_stream_rpc_method_handler(handle)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(wire.ADS_SERVICE, {wire.ADS_METHOD: handler}),)
    )
    server.add_generic_rpc_handlers(tuple(others))
    port = server.add_insecure_port(address)
    await server.start()
    print(f"floor listening on {port}", flush=True)
    return server


async def serve(args: argparse.Namespace) -> None:
    floor = Floor(list(wire.read_records(args.initial)), list(wire.read_records(args.changes)))
    server = await start_ads_floor(floor.handle, f"{args.host}:{args.port}")
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    tasks = [asyncio.create_task(_triggers(floor)), asyncio.create_task(stopped.wait())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await server.stop(0)


def main(argv: list[str] | None = None) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        event_loop.run(serve(parse_args(argv)))  # pilot's loop (PILOT_EVENT_LOOP), as pilot's


if __name__ == "__main__":
    main()
