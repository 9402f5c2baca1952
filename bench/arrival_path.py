"""`python -m bench.arrival_path`: pilot's own CPU per proxy arriving for its certificate.

What `bench.certificates` cannot separate from gRPC: a real `Discovery` (its own
CA, an empty registry file, the CLI's debounce and collector) in this process,
and N delta ADS streams driven straight through `Connection.serve` with an
in-memory gRPC context. They are started at once, and each asks for `default`.
The run ends when every stream has written its certificate. Reported per proxy:
CPU seconds (all threads of this process, the minting thread included), the
event loop's thread alone, and the stream's end afterwards. No socket, no gRPC
thread, no client: what is left is pilot's. On a quiet machine it repeats to
within a few per cent; on a shared one runs spread by a quarter, so compare
two versions in alternating runs, each run from its own checkout's directory:
`python -m` puts the current directory ahead of PYTHONPATH.

`--storm S` is the reconnect storm's stream instead (`bench.eds_push`'s): the
registry file holds S services, and each stream, as `bench.clients`' do,
subscribes to every cluster (`*`), then to the assignment of each cluster it
was sent, ACKing every answer; it counts once it has its assignments.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from bench import wire
from bench.certificates import SECRET, _node
from pilot import logs
from pilot.protocol.kind import StreamKind
from pilot.push.debounce import DebounceSettings
from pilot.server.connection import Connection, StreamContext
from pilot.xds.flavor import Flavor
from tests.support.mesh import simple_mesh
from tests.support.pilot import running_pilot

DELTA_ADS = StreamKind(True, None, Flavor.ADS)


class _Client:
    """One simulated proxy: its first request, and what it does with each answer."""

    def __init__(self, first: bytes, done: Callable[[], None]) -> None:
        self.first = first
        self.done = done
        self.sent: asyncio.Queue[bytes] = asyncio.Queue()  # its requests after the first

    def answered(self, data: bytes) -> None:
        """A proxy asking for its certificate is done once `default` arrives."""
        if b"default" in data:
            self.done()

    async def requests(self) -> AsyncIterator[bytes]:
        yield self.first
        while True:
            yield await self.sent.get()


class _StormClient(_Client):
    """A proxy of the storm: every cluster, then each one's assignment, each answer ACKed."""

    asked_assignments = False

    def answered(self, data: bytes) -> None:
        response = wire.DeltaResponse.FromString(data)
        if response.type_url == wire.CLUSTER and not self.asked_assignments:
            self.asked_assignments = True
            names = [resource.name for resource in response.resources]
            self.sent.put_nowait(wire.subscribe(wire.ENDPOINT, names))
        self.sent.put_nowait(wire.ack(response.type_url, response.nonce))
        if response.type_url == wire.ENDPOINT:
            self.done()


class _Context:
    """The gRPC servicer context as a stream uses it: no credentials, writes answered."""

    def __init__(self, peer: str, client: _Client) -> None:
        self._peer = peer
        self._client = client

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def auth_context(self) -> dict[str, Any]:
        return {}

    async def write(self, data: bytes) -> None:
        self._client.answered(data)

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"the stream was refused: {code} {details}")


def _unobserved(started: bool) -> None:
    """No one to tell when the burst starts or ends."""


def _clients(proxies: int, storm: int, done: Callable[[], None]) -> list[_Client]:
    if storm:
        return [
            _StormClient(wire.subscribe(wire.CLUSTER, ["*"], wire.node(f"bench-{i}")), done)
            for i in range(proxies)
        ]
    return [
        _Client(
            discovery_pb2.DeltaDiscoveryRequest(
                node=_node(i), type_url=SECRET, resource_names_subscribe=["default"]
            ).SerializeToString(),
            done,
        )
        for i in range(proxies)
    ]


def _storm_mesh(services: int) -> list[dict[str, Any]]:
    """`services` services of one endpoint each."""
    addresses = (f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(services))
    return simple_mesh({f"svc-{i}": [ip] for i, ip in enumerate(addresses)})


async def measure(
    proxies: int, folder: Path, burst: Callable[[bool], None] = _unobserved, storm: int = 0
) -> tuple[float, float, float]:
    """(CPU, loop-thread CPU, CPU of the ends) in seconds per proxy; `burst(True)` just
    before the streams start, `burst(False)` once the last is done (has its certificate,
    or with a `storm` of that many services, its assignments)."""
    mesh = _storm_mesh(storm) if storm else []
    async with running_pilot(folder, mesh, debounce=DebounceSettings(), freeze_heap=True) as pilot:
        streams: StreamContext = pilot.discovery.grpc.streams
        everyone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = [proxies]

        def done() -> None:
            waiting[0] -= 1
            if not waiting[0]:
                everyone.set_result(None)

        clients = _clients(proxies, storm, done)
        burst(True)
        cpu, loop_cpu = time.process_time(), time.thread_time()
        tasks = [
            asyncio.ensure_future(
                Connection(streams, DELTA_ADS, f"ipv4:127.0.0.1:{i}").serve(
                    client.requests(),
                    cast("grpc.aio.ServicerContext[Any, bytes]", _Context(f"proxy-{i}", client)),
                )
            )
            for i, client in enumerate(clients)
        ]
        await everyone
        cpu, loop_cpu = time.process_time() - cpu, time.thread_time() - loop_cpu
        burst(False)
        ends = time.process_time()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ends = time.process_time() - ends
    return cpu / proxies, loop_cpu / proxies, ends / proxies


def run(
    proxies: int, burst: Callable[[bool], None] = _unobserved, storm: int = 0
) -> tuple[float, float, float]:
    """`measure`, with pilot's own log lines and handler writing into a file, as its
    stderr would be."""
    with tempfile.TemporaryDirectory(prefix="pilot-arrivals-") as folder:
        logs.configure("info")
        handler = logging.getLogger().handlers[0]
        assert isinstance(handler, logging.StreamHandler)
        with (Path(folder) / "pilot.log").open("w") as log_file:
            handler.setStream(log_file)
            return asyncio.run(measure(proxies, Path(folder), burst, storm))


def add_storm_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storm",
        type=int,
        default=0,
        metavar="S",
        help="the reconnect storm's streams (clusters, then assignments) on S services,"
        " instead of certificates",
    )


def arrivals(proxies: int, storm: int) -> str:
    """What the streams were, as a report names them."""
    if storm:
        return f"{proxies:,} proxies at once, each for {storm:,} clusters and their assignments"
    return f"{proxies:,} proxies at once"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.arrival_path", description=__doc__)
    parser.add_argument("--proxies", type=int, default=1000, help="(1000)")
    add_storm_flag(parser)
    args = parser.parse_args(argv)
    if args.proxies < 1 or args.storm < 0:
        parser.error("--proxies must be at least 1, --storm at least 0")
    cpu, loop_cpu, ends = run(args.proxies, storm=args.storm)
    print(
        f"{arrivals(args.proxies, args.storm)}: CPU {cpu * 1e3:.3f} ms each"
        f" (the loop's thread {loop_cpu * 1e3:.3f} ms), their ends {ends * 1e3:.3f} ms each"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
