"""`python -m bench.clients`: N simulated Envoys, each one delta ADS stream, in one process.

Each stream behaves like a sidecar without scoping: it subscribes to every
Cluster (`*`), subscribes to the ClusterLoadAssignment of every cluster it is
sent, and ACKs every response. The streams share a handful of grpc.aio
channels, each its own HTTP/2 connection.

Reports go to stdout as JSON lines, timestamps from `time.monotonic()`
(CLOCK_MONOTONIC, comparable across the processes of one Linux machine):

- `{"event": "synced", "t": T}` once every stream holds the clusters and all
  their assignments (with `--capture FILE`, stream 0's responses up to then are
  written to FILE first);
- then, each time every stream of this process has received a new version of a
  cluster's assignment: `{"event": "update", "cluster": C, "version": V,
  "first": T, "last": T, "streams": N, "bytes": B, "raw": BASE64, "responses":
  R}`, where first and last are the earliest and latest receive times over the
  streams, B the size of the response that carried it, `raw` stream 0's
  response (only with `--capture`) and R how many responses of any kind all
  streams received since the sync (a check that each change costs one each);
- `{"event": "error", "message": M}` when a stream fails (then exit status 1).

With `--retries N` a failed stream is opened again after Envoy's backoff (full
jitter, 500 ms doubling to 30 s), up to N times, subscribing afresh as a
restarted Envoy does; the "synced" event then counts `retried` streams and
`retries` in all.

The process runs until its standard input closes or it gets SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import functools
import gc
import json
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench import wire

_CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),  # one TCP connection per channel, not one in all
    ("grpc.max_receive_message_length", 1 << 30),
    ("grpc.max_send_message_length", 1 << 30),
]


def emit(event: str, **fields: Any) -> None:
    """One report line on stdout."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


@dataclass(slots=True)
class Arrival:
    """Who has received one (cluster, version) so far."""

    first: float
    last: float
    size: int
    count: int = 0
    raw: bytes = b""


@dataclass
class Recorder:
    """Counts synced streams, then the arrivals of each new assignment version."""

    streams: int
    capture: Path | None
    synced_streams: int = 0
    live: bool = False
    responses: int = 0
    arrivals: dict[tuple[str, str], Arrival] = field(default_factory=dict)
    captured: list[bytes] = field(default_factory=list)

    retried: set[str] = field(default_factory=set)
    retries: int = 0
    failures: collections.Counter[str] = field(default_factory=collections.Counter)

    def stream_synced(self) -> None:
        self.synced_streams += 1
        if self.synced_streams == self.streams:
            if self.capture is not None:
                wire.write_records(self.capture, self.captured)
                self.captured.clear()
            self.live = True
            gc.freeze()  # the sync's objects stay; later collections skip them
            emit(
                "synced",
                t=time.monotonic(),
                retried=len(self.retried),
                retries=self.retries,
                failures=dict(self.failures),
            )

    def assignment(self, name: str, version: str, t: float, raw: bytes, capturing: bool) -> None:
        """One stream received one assignment version (recorded once all streams synced)."""
        if not self.live:
            return
        key = (name, version)
        arrival = self.arrivals.get(key)
        if arrival is None:
            arrival = self.arrivals[key] = Arrival(t, t, len(raw))
        arrival.count += 1
        arrival.last = max(arrival.last, t)
        if capturing:
            arrival.raw = raw
        if arrival.count == self.streams:
            del self.arrivals[key]
            emit(
                "update",
                cluster=name,
                version=version,
                first=arrival.first,
                last=arrival.last,
                streams=arrival.count,
                bytes=arrival.size,
                raw=base64.b64encode(arrival.raw).decode(),
                responses=self.responses,
            )


class StreamEnded(RuntimeError):
    """The server ended the stream without an error status."""


class Stream:
    """One simulated Envoy: a DeltaAggregatedResources stream, opened again if it fails."""

    def __init__(
        self,
        node_id: str,
        open_call: Callable[[], Any],
        recorder: Recorder,
        capturing: bool = False,
        retries: int = 0,
    ) -> None:
        self.node_id = node_id
        self.open_call = open_call
        self.recorder = recorder
        self.capturing = capturing
        self.retries = retries
        self.call: Any = None
        self.subscribed: set[str] = set()
        self.missing: set[str] = set()
        self.has_clusters = False
        self.synced = False

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await self._serve()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, StreamEnded) as error:
                self.recorder.failures[_failure(error)] += 1
                failures += 1
                if failures > self.retries:
                    raise
                self.recorder.retried.add(self.node_id)
                self.recorder.retries += 1
                await asyncio.sleep(_backoff(failures))

    async def _serve(self) -> None:
        self.call = self.open_call()
        self.subscribed.clear()
        self.missing.clear()
        self.has_clusters = False
        await self.call.write(wire.subscribe(wire.CLUSTER, ["*"], self.node_id))
        while True:
            raw = await self.call.read()
            t = time.monotonic()
            if not isinstance(raw, bytes):  # grpc.aio.EOF
                raise StreamEnded(f"{self.node_id}: the server ended the stream")
            response = wire.DeltaResponse.FromString(raw)
            self.recorder.responses += self.synced
            if self.capturing and not self.synced:
                self.recorder.captured.append(raw)
            if response.type_url == wire.CLUSTER:
                await self._clusters(response)
            elif response.type_url == wire.ENDPOINT:
                self._assignments(response, raw, t)
            await self.call.write(wire.ack(response.type_url, response.nonce))

    async def _clusters(self, response: wire.DeltaResponse) -> None:
        """Like Envoy: subscribe to the new clusters' assignments, then ACK the clusters."""
        self.has_clusters = True
        new = [sys.intern(r.name) for r in response.resources if r.name not in self.subscribed]
        if new:
            self.subscribed.update(new)
            if not self.synced:
                self.missing.update(new)
            await self.call.write(wire.subscribe(wire.ENDPOINT, new))
        self._check_synced()

    def _assignments(self, response: wire.DeltaResponse, raw: bytes, t: float) -> None:
        for resource in response.resources:
            if self.synced:
                self.recorder.assignment(resource.name, resource.version, t, raw, self.capturing)
            else:
                self.missing.discard(resource.name)
        self._check_synced()

    def _check_synced(self) -> None:
        if not self.synced and self.has_clusters and not self.missing:
            self.synced = True
            self.recorder.stream_synced()


def _failure(error: BaseException) -> str:
    """A failed stream, as a short kind: the status and the start of its details."""
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {(error.details() or '')[:40]}"
    return type(error).__name__


def _backoff(failures: int) -> float:
    """Envoy's xDS retry delay: full jitter over 500 ms doubling per failure, at most 30 s."""
    return random.uniform(0, min(30.0, 0.5 * 2 ** (failures - 1)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.clients", description=__doc__)
    parser.add_argument("--target", required=True, help="HOST:PORT of the xDS server")
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--first-id", type=int, default=0, help="node ids start here")
    parser.add_argument("--capture", type=Path, help="record stream 0's responses here")
    parser.add_argument("--retries", type=int, default=0, help="per stream, with backoff (0)")
    return parser.parse_args(argv)


async def _stdin_closed() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.read(4096):
        pass


async def _stop_signal() -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    await stopped.wait()


async def run(args: argparse.Namespace) -> int:
    recorder = Recorder(args.streams, args.capture)
    channels = [
        grpc.aio.insecure_channel(args.target, options=_CHANNEL_OPTIONS)
        for _ in range(max(1, min(args.channels, args.streams)))
    ]
    methods = [
        c.stream_stream(wire.ADS_PATH, request_serializer=None, response_deserializer=None)
        for c in channels
    ]
    streams = [
        Stream(
            f"bench-{args.first_id + i}",
            functools.partial(methods[i % len(methods)], None),
            recorder,
            capturing=i == 0 and args.capture is not None,
            retries=args.retries,
        )
        for i in range(args.streams)
    ]
    tasks = [asyncio.create_task(s.run()) for s in streams]
    tasks += [asyncio.create_task(_stdin_closed()), asyncio.create_task(_stop_signal())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        failed = [t.exception() for t in done if t.exception() is not None]
        if failed:
            emit("error", message=str(failed[0]))
            return 1
        return 0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close(grace=None)


def main(argv: list[str] | None = None) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run(parse_args(argv)))
    return 1


if __name__ == "__main__":
    sys.exit(main())
