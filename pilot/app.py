"""The composition root of `pilot discovery`: wires registry, builder, push and servers.

Change flow: source -> endpoint index -> debounce -> builder (rebuilds only what
changed, serializing each resource once) -> hub (marks and wakes only the
streams subscribed to the changed names) -> each stream's writer.

Start-up order: the HTTP port first (so `/ready` answers 503 meanwhile), then
the gRPC port (health NOT_SERVING: Envoys may connect, and wait), then the
registry; streams get their first answers only once the registry has its first
full state, so no Envoy ever receives a partial mesh.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from typing import Protocol

from kubernetes_asyncio import client

from pilot.debug.http import DebugState, HttpServer
from pilot.debug.metrics import Metrics, Sources
from pilot.generators.builder import ResourceBuilder
from pilot.push.debounce import Debouncer
from pilot.registry.index import EndpointIndex, IndexChange
from pilot.security.component import Security
from pilot.security.xds_auth import XdsAuth
from pilot.server.grpc_server import GrpcServer
from pilot.server.hub import XdsHub
from pilot.server.tls import TlsServing, default_dns_names
from pilot.settings import Settings
from pilot.sources.file import FileRegistry
from pilot.sources.kubernetes.connection import connect
from pilot.sources.kubernetes.informer import Informer
from pilot.sources.kubernetes.registry import KubernetesRegistry
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache

log = logging.getLogger("pilot")


class RegistrySource(Protocol):
    """Where services and endpoints come from (a file or a cluster)."""

    @property
    def synced(self) -> bool: ...

    async def start(self) -> None: ...

    async def wait_synced(self) -> None: ...

    async def stop(self) -> None: ...


class Discovery:
    """A running control plane; `start`, then `stop`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stats = XdsStats()
        self.index = EndpointIndex()
        self.cache = ResourceCache()
        self.builder = ResourceBuilder(self.index, self.cache, settings.build, self.stats)
        served = (types.CLUSTER, types.ENDPOINT, types.SECRET)
        self.hub = XdsHub(self.cache, self.stats, served, settings.push)
        self.debouncer = Debouncer(self._flush, settings.debounce)
        self.metrics = Metrics(self._metric_sources())
        self.hub.metrics = self.metrics
        debug = DebugState(self.hub, self.cache, self.index)
        self.http = HttpServer(
            settings.http_addr, self.is_ready, self.metrics, debug, settings.debug_addr
        )
        self.api_client: client.ApiClient | None = None
        self.source: RegistrySource | None = None
        self.security: Security | None = None
        self._grpc: GrpcServer | None = None
        self.tls_serving: TlsServing | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._serving = False

    @property
    def grpc(self) -> GrpcServer:
        assert self._grpc is not None, "pilot has not started"
        return self._grpc

    def _metric_sources(self) -> Sources:
        def informers() -> list[Informer]:
            return self.source.informers if isinstance(self.source, KubernetesRegistry) else []

        return Sources(
            stats=self.stats,
            connections=lambda: len(self.hub.connections),
            services=lambda: len(self.index.services),
            secret_stats=lambda: self.security.secrets.stats if self.security else None,
            ca_stats=lambda: self.security.ca_service.stats if self.security else None,
            informers=informers,
        )

    def _on_registry_change(self, change: IndexChange) -> None:
        self.stats.inbound_updates["svc"] += len(change.full)
        self.stats.inbound_updates["eds"] += len(change.endpoints)
        self.debouncer.submit(change)

    async def _connect_source(self) -> RegistrySource:
        kubernetes = self.settings.kubernetes
        if self.settings.config is None or kubernetes.kubeconfig is not None:
            # With --config, a --kubeconfig serves TokenReview only.
            self.api_client, server = await connect(kubernetes.kubeconfig)
        if self.settings.config is not None:
            return FileRegistry(
                self.settings.config,
                self.index,
                self._on_registry_change,
                self.settings.file_poll_interval,
            )
        assert self.api_client is not None
        return KubernetesRegistry(
            kubernetes, self.index, self._on_registry_change, self.api_client, server
        )

    async def _start_security(self) -> Security:
        default_auth = XdsAuth.NONE if self.settings.config is not None else XdsAuth.KUBERNETES
        security = await Security.create(
            self.settings.security,
            self.api_client,
            default_auth,
            self.hub.secret_changed,
            shared_root=self.settings.config is None,
        )
        self.hub.secrets = security.secrets
        self.hub.identities = security.identities
        security.secrets.observe_ca_latency = self.metrics.ca_latency.observe
        return security

    def _tls(self, security: Security) -> tuple[str, TlsServing] | None:
        if not self.settings.grpc_tls_addr:
            return None
        names = list(self.settings.tls_dns_names) or default_dns_names(
            self.settings.build.cluster_domain
        )
        self.tls_serving = TlsServing(security.ca, names, self.settings.tls_require_client_cert)
        return self.settings.grpc_tls_addr, self.tls_serving

    def is_ready(self) -> bool:
        return self._serving and self.source is not None and self.source.synced

    def _flush(self, change: IndexChange, started: float) -> None:
        self.metrics.debounce.observe(time.monotonic() - started)
        changes = self.builder.apply(change)
        if changes:
            woken = self.hub.push(changes, started)
            counts = {types.short_name(t): len(n) for t, n in changes.items()}
            log.debug("push %s to %d streams", counts, woken)

    async def start(self) -> None:
        """Serve /ready, sync the registry, then serve xDS."""
        await self.http.start()
        self.source = await self._connect_source()
        self.security = await self._start_security()
        self._grpc = GrpcServer(
            self.hub,
            self.settings.grpc_addr,
            ca_service=self.security.ca_service,
            tls=self._tls(self.security),
            max_connection_age=self.settings.max_connection_age,
            drain=self.settings.drain_duration,
        )
        await self.grpc.start()
        await self.source.start()
        await self.source.wait_synced()
        initial, _ = self.debouncer.take()
        self._flush(initial, time.monotonic())
        # The registry, cache and code are long-lived: keep full collections from
        # rescanning them on every push (they caused the benchmark's p99 pauses).
        if self.settings.freeze_heap:
            gc.collect()
            gc.freeze()
        self.hub.ready.set()
        self._tasks = [asyncio.create_task(self.debouncer.run(), name="debounce")]
        if self.tls_serving is not None:
            self._tasks.append(asyncio.create_task(self.tls_serving.run(), name="tls-renewal"))
        if self.security.elector is not None:
            # Holds the Lease for single-writer CA duties (root creation, later rotation).
            self._tasks.append(asyncio.create_task(self.security.elector.run(), name="ca-lease"))
        await self.grpc.set_serving(True)
        self._serving = True
        log.info(
            "pilot discovery serving xDS on %s (port %d, TLS port %d), HTTP on %s:%d",
            self.settings.grpc_addr,
            self.grpc.port,
            self.grpc.tls_port,
            self.http.host,
            self.http.port,
        )

    async def stop(self) -> None:
        """Health goes NOT_SERVING, streams end, background work stops."""
        self._serving = False
        if self.settings.freeze_heap:
            gc.unfreeze()  # what start() froze becomes collectable again
        if self._grpc is not None:
            await self._grpc.stop(self.settings.drain_duration)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.source is not None:
            await self.source.stop()
        if self.security is not None:
            await self.security.close()
        if self.api_client is not None:
            await self.api_client.close()
        await self.http.stop()
