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

from bench.certificates import SECRET, _node
from pilot import logs
from pilot.protocol.kind import StreamKind
from pilot.push.debounce import DebounceSettings
from pilot.server.connection import Connection, StreamContext
from pilot.xds.flavor import Flavor
from tests.support.pilot import running_pilot

DELTA_ADS = StreamKind(True, None, Flavor.ADS)


class _Context:
    """The gRPC servicer context as a stream uses it: no credentials, writes counted."""

    def __init__(self, peer: str, certified: Callable[[], None]) -> None:
        self._peer = peer
        self._certified = certified

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def auth_context(self) -> dict[str, Any]:
        return {}

    async def write(self, data: bytes) -> None:
        if b"default" in data:
            self._certified()

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"the stream was refused: {code} {details}")


async def _requests(first: bytes, held: asyncio.Future[None]) -> AsyncIterator[bytes]:
    yield first
    await held  # the client stays, and sends nothing more


def _unobserved(started: bool) -> None:
    """No one to tell when the burst starts or ends."""


async def measure(
    proxies: int, folder: Path, burst: Callable[[bool], None] = _unobserved
) -> tuple[float, float, float]:
    """(CPU, loop-thread CPU, CPU of the ends) in seconds per proxy; `burst(True)` just
    before the streams start, `burst(False)` once the last has its certificate."""
    async with running_pilot(folder, [], debounce=DebounceSettings(), freeze_heap=True) as pilot:
        streams: StreamContext = pilot.discovery.grpc.streams
        loop = asyncio.get_running_loop()
        held: asyncio.Future[None] = loop.create_future()
        everyone: asyncio.Future[None] = loop.create_future()
        waiting = [proxies]

        def certified() -> None:
            waiting[0] -= 1
            if not waiting[0]:
                everyone.set_result(None)

        firsts = [
            discovery_pb2.DeltaDiscoveryRequest(
                node=_node(i), type_url=SECRET, resource_names_subscribe=["default"]
            ).SerializeToString()
            for i in range(proxies)
        ]
        burst(True)
        cpu, loop_cpu = time.process_time(), time.thread_time()
        tasks = [
            asyncio.ensure_future(
                Connection(streams, DELTA_ADS, f"ipv4:127.0.0.1:{i}").serve(
                    _requests(firsts[i], held),
                    cast("grpc.aio.ServicerContext[Any, bytes]", _Context(f"proxy-{i}", certified)),
                )
            )
            for i in range(proxies)
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


def run(proxies: int, burst: Callable[[bool], None] = _unobserved) -> tuple[float, float, float]:
    """`measure`, with pilot's own log lines and handler writing into a file, as its
    stderr would be."""
    with tempfile.TemporaryDirectory(prefix="pilot-arrivals-") as folder:
        logs.configure("info")
        handler = logging.getLogger().handlers[0]
        assert isinstance(handler, logging.StreamHandler)
        with (Path(folder) / "pilot.log").open("w") as log_file:
            handler.setStream(log_file)
            return asyncio.run(measure(proxies, Path(folder), burst))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.arrival_path", description=__doc__)
    parser.add_argument("--proxies", type=int, default=1000, help="(1000)")
    args = parser.parse_args(argv)
    cpu, loop_cpu, ends = run(args.proxies)
    print(
        f"{args.proxies:,} proxies at once: CPU {cpu * 1e3:.3f} ms each"
        f" (the loop's thread {loop_cpu * 1e3:.3f} ms), their ends {ends * 1e3:.3f} ms each"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
