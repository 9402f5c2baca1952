"""The composition root of `pilot discovery`: wires registry, builder, push and servers.

Change flow: source -> endpoint index -> debounce -> builder (rebuilds only what
changed, serializing each resource once) -> hub (marks and wakes only the
streams subscribed to the changed names) -> each stream's writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from pilot.debug.http import HttpServer
from pilot.generators.builder import ResourceBuilder
from pilot.push.debounce import Debouncer
from pilot.registry.index import EndpointIndex, IndexChange
from pilot.server.grpc_server import GrpcServer
from pilot.server.hub import XdsHub
from pilot.settings import Settings
from pilot.sources.file import FileRegistry
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache

log = logging.getLogger("pilot")


class Discovery:
    """A running control plane; `start`, then `stop`."""

    def __init__(self, settings: Settings) -> None:
        if settings.config is None:
            raise NotImplementedError("the Kubernetes registry is not available yet; use --config")
        self.settings = settings
        self.stats = XdsStats()
        self.index = EndpointIndex()
        self.cache = ResourceCache()
        self.builder = ResourceBuilder(self.index, self.cache, settings.build, self.stats)
        self.hub = XdsHub(self.cache, self.stats, (types.CLUSTER, types.ENDPOINT))
        self.debouncer = Debouncer(self._flush, settings.debounce)
        self.source = FileRegistry(
            settings.config, self.index, self.debouncer.submit, settings.file_poll_interval
        )
        self.grpc = GrpcServer(self.hub, settings.grpc_addr)
        self.http = HttpServer(settings.http_addr, self.is_ready)
        self._tasks: list[asyncio.Task[None]] = []

    def is_ready(self) -> bool:
        return self.source.synced

    def _flush(self, change: IndexChange, started: float) -> None:
        changes = self.builder.apply(change)
        if changes:
            woken = self.hub.push(changes, started)
            log.debug(
                "push: %s to %d streams",
                {types.short_name(t): len(n) for t, n in changes.items()},
                woken,
            )

    async def start(self) -> None:
        """Load the registry, then serve."""
        initial = self.source.load()
        if initial:
            self._flush(initial, time.monotonic())
        await self.grpc.start()
        await self.http.start()
        await self.grpc.set_serving(True)
        self._tasks = [
            asyncio.create_task(self.debouncer.run(), name="debounce"),
            asyncio.create_task(self.source.run(), name="file-registry"),
        ]
        log.info(
            "pilot discovery serving xDS on %s (port %d), HTTP on %s:%d",
            self.settings.grpc_addr,
            self.grpc.port,
            self.http.host,
            self.http.port,
        )

    async def stop(self) -> None:
        """Health goes NOT_SERVING, streams end, background work stops."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.grpc.stop(self.settings.shutdown_grace)
        await self.http.stop()
