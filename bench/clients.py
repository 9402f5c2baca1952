"""`python -m bench.clients`: N simulated Envoys, each one delta ADS stream, in one process.

Each stream behaves like a sidecar without scoping: it subscribes to every
Cluster (`*`), subscribes to the ClusterLoadAssignment of every cluster it is
sent, and ACKs every response. The streams share a handful of grpc.aio
channels, each its own HTTP/2 connection.

With `--nodes FILE` (JSON lines, one node a line: `{"id": ..., "metadata":
{...}}`; stream i takes line `--first-id` + i) the streams are Istio sidecars
with listeners, doing what Envoy does: once the first clusters are warm (their
assignments in), it subscribes to every Listener (`*`), then to the
RouteConfiguration each listener's HTTP connection manager names (`rds`
`route_config_name`); only clusters of discovery type EDS get an assignment
subscription, as in Envoy. Secrets are not asked for (in Istio's split the
agent serves them to Envoy over its own socket) unless `--secrets` is given.

With `--secrets` (sidecars only) each sidecar, once its first clusters arrive
(their transport sockets name SDS secrets), also opens a stream of its own to
the same server, as Envoy's `sds-grpc` cluster does: a delta SDS stream
(`SecretDiscoveryService/DeltaSecrets`, on channels of its own: another
cluster, other connections), its first request carrying the sidecar's node
and subscribing to `default` and `ROOTCA`, every response ACKed. (The clusters
pilot sends name `sds-grpc` with `api_type: GRPC`, for which Envoy would call
StreamSecrets, state of the world: the same secrets and mint, another framing.
The bench speaks delta, as its other streams do.) As in Envoy,
whose clusters warm only once their secrets are in, the listeners are asked
for once the assignments *and* both secrets are in, and the stream counts as
synced only then.

Reports go to stdout as JSON lines, timestamps from `time.monotonic()`
(CLOCK_MONOTONIC, comparable across the processes of one Linux machine):

- `{"event": "synced", "t": T, "bytes": {TYPE: B}, "sync_responses": {TYPE: R},
  "held": {TYPE: H}}` once every stream holds the clusters and all their
  assignments (sidecars: and the listeners and their routes), each response
  ACKed; B and R the bytes and responses of each type all streams received
  until then, H how many assignments (and routes) all streams subscribed to and
  hold, a check that two servers served the same mesh (with `--capture FILE`,
  stream 0's responses up to then are written to FILE first); with `--secrets`
  also `"secrets": {"first": T, "last": T, "held": H}`: the first SDS request,
  the last stream's receipt of its first certificate, and how many streams hold
  both secrets;
- then, each time every stream of this process has received a new version of a
  resource (its `version`; from a server that versions responses, not resources,
  as istiod does, the response's `system_version_info`): `{"event": "update",
  "type": TYPE, "name": C, "version": V, "first": T, "last": T, "streams": N,
  "bytes": B, "raw": BASE64, "responses": R, "by_type": {TYPE: R}}`, where
  first and last are the earliest and latest receive times over the streams, B
  the size of the response that carried it, `raw` stream 0's response (only
  with `--capture`), R how many responses of any kind all streams received
  since the sync (a check that each change costs one each) and `by_type` the
  same per type;
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
import math
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

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


Key = tuple[str, str, str]  # type URL, resource name, version
# A response of this type names resources of that type the stream then subscribes to.
FOLLOWS = {wire.CLUSTER: wire.ENDPOINT, wire.LISTENER: wire.ROUTE}
_HCM = (
    "type.googleapis.com/envoy.extensions.filters.network."
    "http_connection_manager.v3.HttpConnectionManager"
)


@dataclass(slots=True)
class Arrival:
    """Who has received one (type, name, version) so far."""

    first: float
    last: float
    size: int
    count: int = 0
    raw: bytes = b""


@dataclass
class Recorder:
    """Counts synced streams, then the arrivals of each new resource version."""

    streams: int
    capture: Path | None
    synced_streams: int = 0
    live: bool = False
    responses: collections.Counter[str] = field(default_factory=collections.Counter)
    sync_bytes: collections.Counter[str] = field(default_factory=collections.Counter)
    sync_responses: collections.Counter[str] = field(default_factory=collections.Counter)
    held: collections.Counter[str] = field(default_factory=collections.Counter)  # at the sync
    arrivals: dict[Key, Arrival] = field(default_factory=dict)
    captured: list[bytes] = field(default_factory=list)

    retried: set[str] = field(default_factory=set)
    retries: int = 0
    failures: collections.Counter[str] = field(default_factory=collections.Counter)

    secrets: bool = False  # the streams also hold `default` and `ROOTCA`
    secrets_first: float = math.inf  # the first SDS request
    secrets_last: float = 0.0  # the last stream's receipt of its first certificate
    secrets_held: int = 0  # streams holding both secrets

    def received(self, type_url: str, size: int, synced: bool) -> None:
        """One response reached one stream (synced: that stream had synced before)."""
        if synced:
            self.responses[type_url] += 1
        else:
            self.sync_bytes[type_url] += size
            self.sync_responses[type_url] += 1

    def asked_secrets(self, t: float) -> None:
        self.secrets_first = min(self.secrets_first, t)

    def certificate_in(self, t: float) -> None:
        """One stream received its first certificate (`default`) at t."""
        self.secrets_last = max(self.secrets_last, t)

    def stream_synced(self, following: dict[str, int]) -> None:
        """One more stream synced, holding `following` resources of each followed type."""
        self.synced_streams += 1
        self.held.update(following)
        if self.synced_streams == self.streams:
            if self.capture is not None:
                wire.write_records(self.capture, self.captured)
                self.captured.clear()
            self.live = True
            gc.freeze()  # the sync's objects stay; later collections skip them
            more: dict[str, Any] = {}
            if self.secrets:
                held = {"first": self.secrets_first, "last": self.secrets_last}
                more["secrets"] = {**held, "held": self.secrets_held}
            emit(
                "synced",
                t=time.monotonic(),
                retried=len(self.retried),
                retries=self.retries,
                failures=dict(self.failures),
                bytes=dict(self.sync_bytes),
                sync_responses=dict(self.sync_responses),
                held=dict(self.held),
                **more,
            )

    def arrival(self, key: Key, t: float, raw: bytes, capturing: bool) -> None:
        """One stream received one resource version (recorded once all streams synced)."""
        if not self.live:
            return
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
                type=key[0],
                name=key[1],
                version=key[2],
                first=arrival.first,
                last=arrival.last,
                streams=arrival.count,
                bytes=arrival.size,
                raw=base64.b64encode(arrival.raw).decode(),
                responses=sum(self.responses.values()),
                by_type=dict(self.responses),
            )


class Decoded:
    """What a sidecar reads in clusters and listeners, decoded once per resource version.

    Every stream of a process is sent the same bytes: decoding them once per
    stream would make the clients, not the server, the bench's bottleneck.
    """

    def __init__(self) -> None:
        self._eds: dict[tuple[str, str], bool] = {}
        self._routes: dict[tuple[str, str], tuple[str, ...]] = {}

    def is_eds(self, resource: Any) -> bool:
        """Whether a Cluster is of discovery type EDS (the others have no assignment)."""
        key = (resource.name, resource.version)
        found = self._eds.get(key)
        if found is None:
            cluster = cluster_pb2.Cluster.FromString(resource.resource.value)
            found = self._eds[key] = cluster.type == cluster_pb2.Cluster.EDS
        return found

    def routes(self, resource: Any) -> tuple[str, ...]:
        """The route configurations a Listener's HTTP connection managers read over RDS."""
        key = (resource.name, resource.version)
        found = self._routes.get(key)
        if found is None:
            found = self._routes[key] = _route_names(resource.resource.value)
        return found


def _route_names(raw: bytes) -> tuple[str, ...]:
    listener = listener_pb2.Listener.FromString(raw)
    chains = list(listener.filter_chains)
    if listener.HasField("default_filter_chain"):
        chains.append(listener.default_filter_chain)
    names = []
    for chain in chains:
        for network_filter in chain.filters:
            if network_filter.typed_config.type_url != _HCM:
                continue
            manager = hcm_pb2.HttpConnectionManager()
            network_filter.typed_config.Unpack(manager)
            if manager.HasField("rds"):
                names.append(sys.intern(manager.rds.route_config_name))
    return tuple(dict.fromkeys(names))


class StreamEnded(RuntimeError):
    """The server ended the stream without an error status."""


class Secrets:
    """A sidecar's SDS stream, as Envoy's `sds-grpc` cluster opens it: DeltaSecrets for
    `default` and `ROOTCA`, every response ACKed, opened again after a failure (Envoy's
    backoff) up to `retries` times.

    It waits for `wanted` (the first clusters arrived); `held` is done once both
    secrets are in, or failed if the stream failed for good.
    """

    def __init__(
        self, node: base_pb2.Node, open_call: Callable[[], Any], recorder: Recorder, retries: int
    ) -> None:
        self.node = node
        self.open_call = open_call
        self.recorder = recorder
        self.retries = retries
        self.wanted = asyncio.Event()
        self.held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.names: set[str] = set()

    async def run(self) -> None:
        await self.wanted.wait()
        failures = 0
        while True:
            try:
                await self._serve()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, StreamEnded) as error:
                self.recorder.failures[f"SDS {_failure(error)}"] += 1
                failures += 1
                if failures > self.retries:
                    if not self.held.done():
                        self.held.set_exception(error)
                    raise
                self.recorder.retried.add(self.node.id)
                self.recorder.retries += 1
                await asyncio.sleep(_backoff(failures))

    async def _serve(self) -> None:
        call = self.open_call()
        self.recorder.asked_secrets(time.monotonic())
        await call.write(wire.subscribe(wire.SECRET, wire.SECRET_NAMES, self.node))
        while True:
            raw = await call.read()
            t = time.monotonic()
            if not isinstance(raw, bytes):  # grpc.aio.EOF
                raise StreamEnded(f"{self.node.id}: the server ended the SDS stream")
            response = wire.DeltaResponse.FromString(raw)
            # Until both are in, its responses are the sync's; later ones (a rotation) are not
            # updates a series waits for, only counted.
            self.recorder.received(response.type_url, len(raw), self.held.done())
            names = {resource.name for resource in response.resources}
            if wire.WORKLOAD_SECRET in names - self.names:
                self.recorder.certificate_in(t)
            self.names |= names
            await call.write(wire.ack(response.type_url, response.nonce))
            if not self.held.done() and self.names.issuperset(wire.SECRET_NAMES):
                self.recorder.secrets_held += 1
                self.held.set_result(None)


class Stream:
    """One simulated Envoy: a DeltaAggregatedResources stream, opened again if it fails."""

    def __init__(
        self,
        node: base_pb2.Node,
        open_call: Callable[[], Any],
        recorder: Recorder,
        *,
        capturing: bool = False,
        retries: int = 0,
        sidecar: Decoded | None = None,
        secrets: Secrets | None = None,
    ) -> None:
        self.node = node
        self.secrets = secrets  # None: no SDS stream
        self.node_id = node.id
        self.open_call = open_call
        self.recorder = recorder
        self.capturing = capturing
        self.retries = retries
        self.sidecar = sidecar  # None: clusters and assignments only
        self.call: Any = None
        self.subscribed: dict[str, set[str]] = {}
        self.missing: dict[str, set[str]] = {}
        self.types: set[str] = set()  # the types it has been sent
        self.asked_listeners = False
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
        self.subscribed = {followed: set() for followed in FOLLOWS.values()}
        self.missing = {followed: set() for followed in FOLLOWS.values()}
        self.types.clear()
        self.asked_listeners = False
        await self.call.write(wire.subscribe(wire.CLUSTER, ["*"], self.node))
        while True:
            raw = await self._read()
            t = time.monotonic()
            if not isinstance(raw, bytes):  # grpc.aio.EOF
                raise StreamEnded(f"{self.node_id}: the server ended the stream")
            response = wire.DeltaResponse.FromString(raw)
            self.recorder.received(response.type_url, len(raw), self.synced)
            if self.synced:
                for resource in response.resources:
                    # istiod versions its responses, not its resources: a push is one version.
                    version = resource.version or response.system_version_info
                    key = (response.type_url, resource.name, version)
                    self.recorder.arrival(key, t, raw, self.capturing)
            elif self.capturing:
                self.recorder.captured.append(raw)
            # Like Envoy: subscribe to what the new resources name, then ACK them.
            follow = self._follow(response)
            if follow is not None:
                await self.call.write(follow)
            await self.call.write(wire.ack(response.type_url, response.nonce))
            await self._progress()

    async def _read(self) -> Any:
        """The next response; with an SDS stream, the secrets' arrival in the meantime also
        moves the sync on (they may be the last thing the listeners wait for)."""
        secrets = self.secrets
        if secrets is None:
            return await self.call.read()
        if secrets.held.done():
            await self._progress()
            return await self.call.read()
        read = asyncio.ensure_future(self.call.read())
        await asyncio.wait([read, secrets.held], return_when=asyncio.FIRST_COMPLETED)
        if not read.done() and secrets.held.exception() is None:
            await self._progress()
        return await read  # an SDS stream failed for good fails the process through its task

    def _follow(self, response: wire.DeltaResponse) -> bytes | None:
        """The subscription a response calls for (assignments of new clusters, routes of
        new listeners), if any; notes what it brought that the sync was missing."""
        kind = response.type_url
        self.types.add(kind)
        if kind == wire.CLUSTER and self.secrets is not None:
            self.secrets.wanted.set()  # the clusters' transport sockets name SDS secrets
        if kind in self.missing:
            for resource in response.resources:
                self.missing[kind].discard(resource.name)
            return None
        followed = FOLLOWS.get(kind)
        if followed is None:
            return None
        held = self.subscribed[followed]
        new = [name for name in self._named(response) if name not in held]
        if not new:
            return None
        held.update(new)
        if not self.synced:
            self.missing[followed].update(new)
        return wire.subscribe(followed, new)

    def _named(self, response: wire.DeltaResponse) -> list[str]:
        """The resources of the followed type that a cluster or listener response names."""
        decoded = self.sidecar
        if response.type_url == wire.LISTENER:
            assert decoded is not None
            return [name for r in response.resources for name in decoded.routes(r)]
        return [
            sys.intern(r.name) for r in response.resources if decoded is None or decoded.is_eds(r)
        ]

    async def _progress(self) -> None:
        """Ask for listeners once the first clusters are warm (as Envoy); note the sync."""
        warm = wire.CLUSTER in self.types and not self.missing[wire.ENDPOINT]
        if self.secrets is not None:
            warm = warm and self.secrets.held.done() and self.secrets.held.exception() is None
        if self.sidecar is not None and warm and not self.asked_listeners:
            self.asked_listeners = True
            await self.call.write(wire.subscribe(wire.LISTENER, ["*"]))
        if self.synced or not warm or any(self.missing.values()):
            return
        if self.sidecar is None or wire.LISTENER in self.types:
            self.synced = True
            self.recorder.stream_synced({k: len(v) for k, v in self.subscribed.items()})


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
    parser.add_argument("--nodes", type=Path, help="sidecars: their nodes, JSON lines")
    parser.add_argument(
        "--secrets", action="store_true", help="sidecars: also an SDS stream each (see above)"
    )
    args = parser.parse_args(argv)
    if args.secrets and args.nodes is None:
        parser.error("--secrets: sidecars only (--nodes)")
    return args


def _nodes(args: argparse.Namespace) -> list[base_pb2.Node]:
    """The streams' nodes: `bench-K`, or the sidecars' lines of the nodes file."""
    first, count = args.first_id, args.streams
    if args.nodes is None:
        return [wire.node(f"bench-{first + i}") for i in range(count)]
    lines = args.nodes.read_text().splitlines()[first : first + count]
    if len(lines) != count:
        raise SystemExit(f"{args.nodes}: fewer than {first + count} nodes")
    nodes = [json.loads(line) for line in lines]
    return [wire.node(n["id"], n.get("metadata")) for n in nodes]


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


def _methods(channels: list[grpc.aio.Channel], path: str) -> list[Callable[[], Any]]:
    """Per channel, a call of the streaming method at path (raw bytes each way)."""
    return [
        functools.partial(
            c.stream_stream(path, request_serializer=None, response_deserializer=None), None
        )
        for c in channels
    ]


async def run(args: argparse.Namespace) -> int:
    recorder = Recorder(args.streams, args.capture, secrets=args.secrets)
    count = max(1, min(args.channels, args.streams))
    channels = [
        grpc.aio.insecure_channel(args.target, options=_CHANNEL_OPTIONS) for _ in range(count)
    ]
    methods = _methods(channels, wire.ADS_PATH)
    # sds-grpc is a cluster of its own: its streams go over connections of their own.
    sds_channels = [
        grpc.aio.insecure_channel(args.target, options=_CHANNEL_OPTIONS)
        for _ in range(count if args.secrets else 0)
    ]
    sds_methods = _methods(sds_channels, wire.SDS_PATH)
    sidecar = Decoded() if args.nodes is not None else None
    streams = []
    secrets = []
    for i, node in enumerate(_nodes(args)):
        if args.secrets:
            secrets.append(Secrets(node, sds_methods[i % count], recorder, args.retries))
        stream = Stream(
            node,
            methods[i % count],
            recorder,
            capturing=i == 0 and args.capture is not None,
            retries=args.retries,
            sidecar=sidecar,
            secrets=secrets[-1] if args.secrets else None,
        )
        streams.append(stream)
    tasks = [asyncio.create_task(s.run()) for s in streams]
    tasks += [asyncio.create_task(s.run()) for s in secrets]
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
        for channel in [*channels, *sds_channels]:
            await channel.close(grace=None)


def main(argv: list[str] | None = None) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run(parse_args(argv)))
    return 1


if __name__ == "__main__":
    sys.exit(main())
