"""The composition root of `pilot discovery`: builds every part and wires them, once.

Change flow (each step only calls the next, downwards):
  source (file, informers) -> `IndexUpdater` -> endpoint index -> `RequestSink`
  -> `Pipeline.submit`
  -> debounce -> build (the generators: `ClusterGenerator` for CDS, `EndpointGenerator` for EDS,
  `ListenerGenerator` for LDS, `RouteGenerator` for RDS, `SecretGenerator` for SDS)
  -> cache -> fan-out (`SubscriberIndex`)
  -> each stream's writer (`server.Connection`).
Certificates enter the same pipeline: the secret manager reports a proxy whose
certificate was minted or rotated, and the SDS generator submits it.
See docs/architecture.md.

Ports: as in Istio, tokens and private keys travel over TLS only. In
Kubernetes mode the plaintext port serves CDS and EDS and asks for no
credentials; the TLS port serves everything (xDS with SDS, the CA, CSDS) to
callers that prove who they are. With --config (loopback development) the
plaintext port serves everything too; --plaintext-secrets forces that.

Start-up order: the HTTP port first (so `/ready` answers 503 meanwhile), then
the security component (it may wait for the shared root), the pipeline and
the gRPC port (health NOT_SERVING: Envoys may connect, and wait), then the
registry; streams get their first answers only once the registry has its first
full state, so no Envoy ever receives a partial mesh.

Every long-lived task (each cluster's informers, the Secret reconciler, the file
poll, the push pipeline, TLS renewal, the CA lease, the root publisher) runs
under one `Supervisor`: one that fails is logged, counted, shown under `/ready`
and started again with backoff. A failing local informer does not make `/ready`
503: as in Istio, readiness is the first full sync; pilot keeps serving the last
good state, and `/ready`'s lines and `pilot_cluster_synced` say what is failing.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pilot.debug.csds import CSDS_SERVICE, StatusReaders, csds_handler
from pilot.debug.http import DebugState, HttpServer
from pilot.debug.metrics import Metrics, Sources, WatchCounts
from pilot.debug.proxy_status import LiveProxies
from pilot.generators.cds import ClusterGenerator
from pilot.generators.eds import EndpointGenerator
from pilot.generators.inbound_proxies import InboundGenerator
from pilot.generators.lds import ListenerGenerator
from pilot.generators.rds import RouteGenerator
from pilot.generators.sds import SecretGenerator
from pilot.kube.informer import Watching, cluster_status
from pilot.limits import Admission
from pilot.push.history import PushHistory
from pilot.push.pipeline import Pipeline
from pilot.push.request import RequestSink
from pilot.registry.index import EndpointIndex
from pilot.registry.peer_authentication import PeerAuthentications
from pilot.registry.updater import IndexUpdater
from pilot.runtime import collector, event_loop
from pilot.runtime.supervisor import Supervisor
from pilot.security.ca_service import CA_SERVICE
from pilot.security.component import Security
from pilot.security.serving import TlsServing, default_dns_names
from pilot.security.xds_auth import XdsAuth
from pilot.server.connection import Connection, StreamContext
from pilot.server.grpc_server import ExtraService, GrpcServer, Listener
from pilot.server.live_streams import LiveStreams
from pilot.settings import Settings
from pilot.sources.file import FileSource
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache

if TYPE_CHECKING:
    from kubernetes_asyncio import client

    from pilot.kubernetes_mode import KubernetesMode
    from pilot.sources.kubernetes.cluster_source import ClusterSource
    from pilot.sources.kubernetes.clusters import RemoteClusters


log = logging.getLogger("pilot")


def _kubernetes() -> KubernetesMode:
    """The one door to what needs Kubernetes' client (0.7 s to import, about half of a start
    from a file, which never calls it): opened the first time pilot has an API to call."""
    from pilot.kubernetes_mode import KubernetesMode  # noqa: PLC0415

    return KubernetesMode()


class RegistrySource(Protocol):
    """Where services and endpoints come from (a file or a cluster)."""

    @property
    def synced(self) -> bool: ...

    async def start(self) -> None: ...

    async def wait_synced(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Started:
    """What `Discovery.start` builds, by one function (`_build`): it exists only whole.

    Optional only where a mode has none: the TLS port's serving (no TLS port), the API
    client (a file and no --kubeconfig), the cluster source (a file), remote clusters (a
    file and no --remote-kubeconfig).
    """

    security: Security
    pipeline: Pipeline
    inbound: InboundGenerator
    grpc: GrpcServer
    source: RegistrySource
    tls: TlsServing | None
    api_client: client.ApiClient | None
    kubernetes: ClusterSource | None  # the source, in Kubernetes mode
    remotes: RemoteClusters | None

    async def stop(self) -> None:
        """After the streams ended and the tasks stopped: the sources, then the clients."""
        await self.source.stop()
        if self.remotes is not None:
            await self.remotes.stop()
        await self.security.close()
        if self.api_client is not None:
            await self.api_client.close()


class Discovery:
    """A running control plane; `start`, then `stop`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stats = XdsStats()
        self.index = EndpointIndex(primary=settings.cluster_id)
        self.cache = ResourceCache()
        self.policies = PeerAuthentications()  # mTLS modes per workload, read by inbound
        self.connections: LiveStreams[Connection] = LiveStreams()
        self.admission = Admission.of(settings.limits)
        self.proxies = LiveProxies(self.connections, self.cache)
        self.pushes = PushHistory()  # the pipeline records, the /debug page reads
        self.supervisor = Supervisor()
        self.watching = Watching(self.supervisor)
        self.metrics = Metrics(self._metric_sources())
        self.http = HttpServer(
            settings.http_addr,
            self.is_ready,
            self.metrics,
            DebugState(self.proxies, self.index, self.pushes),
            settings.debug_addr,
            ready_detail=self.cluster_lines,
            xds_ports=self.xds_ports,
        )
        self.started: Started | None = None  # whole once `start` has built it, else None
        self._serving = False
        self._thresholds: tuple[int, int, int] | None = None  # the collector's, once settled

    def _started(self) -> Started:
        assert self.started is not None, "pilot has not started"
        return self.started

    # What `start` built, for callers that come after it (tests, benches, the debug views).
    @property
    def grpc(self) -> GrpcServer:
        return self._started().grpc

    @property
    def security(self) -> Security:
        return self._started().security

    @property
    def pipeline(self) -> Pipeline:
        return self._started().pipeline

    @property
    def inbound(self) -> InboundGenerator:
        return self._started().inbound

    @property
    def source(self) -> RegistrySource:
        return self._started().source

    @property
    def remotes(self) -> RemoteClusters | None:
        return self._started().remotes

    def _metric_sources(self) -> Sources:
        # Read while pilot starts too: before `start` has built its parts, they are none.
        def informers() -> list[WatchCounts]:
            started = self.started
            return list(started.kubernetes.informers) if started and started.kubernetes else []

        def remotes() -> RemoteClusters | None:
            return self.started.remotes if self.started is not None else None

        def inbound() -> InboundGenerator | None:
            return self.started.inbound if self.started is not None else None

        def security() -> Security | None:
            return self.started.security if self.started is not None else None

        return Sources(
            stats=self.stats,
            connections=lambda: len(self.connections),
            services=lambda: len(self.index.services),
            inbound_shapes=lambda: g.shapes if (g := inbound()) else 0,
            inbound_failed_closed=lambda: g.failed_closed if (g := inbound()) else 0,
            secret_stats=lambda: c.secrets.stats if (c := security()) else None,
            ca_stats=lambda: c.ca_service.stats if (c := security()) else None,
            limit_hits=lambda: self.admission.hits.counts,
            informers=informers,
            clusters=lambda: {c: s == "synced" for c, s in self.cluster_statuses().items()},
            remote_clusters=lambda: len(r) if (r := remotes()) is not None else 0,
            remote_refusals=lambda: r.refusals if (r := remotes()) is not None else {},
            remote_insecure=lambda: r.insecure() if (r := remotes()) is not None else 0,
            task_failures=lambda: self.supervisor.failures,
            watch_faults=lambda: self.watching.faults.counts,
        )

    def is_ready(self) -> bool:
        """The local registry has synced; remote clusters never hold this back."""
        return self._serving and self.started is not None and self.started.source.synced

    def cluster_statuses(self) -> dict[str, str]:
        """Cluster id -> synced, syncing or unreachable: the local cluster first."""
        started = self.started
        kubernetes = started.kubernetes if started is not None else None
        informers = kubernetes.informers if kubernetes is not None else []
        local = cluster_status(informers, started is not None and started.source.synced)
        remotes = started.remotes if started is not None else None
        statuses = remotes.statuses() if remotes is not None else {}
        return {self.settings.cluster_id: local} | statuses

    def cluster_lines(self) -> list[str]:
        """`/ready`'s detail: each cluster's status, then each failing task."""
        clusters = [f"cluster {c}: {status}" for c, status in self.cluster_statuses().items()]
        return clusters + self.supervisor.lines()

    def xds_ports(self) -> str:
        """Where xDS is, for a TLS or HTTP/2 client that came to the HTTP port instead:
        the bound ports once they are, else the flags' addresses."""
        plain, tls = self.settings.grpc_addr, self.settings.grpc_tls_addr
        if self.started is not None:
            plain = f"port {self.grpc.port}"
            tls = f"port {self.grpc.tls_port}" if self.grpc.tls_port else ""
        where = f"xDS (gRPC) is {plain} (--grpc-addr)"
        return where + (f", over TLS {tls} (--grpc-tls-addr)" if tls else "")

    async def _connect(self) -> tuple[client.ApiClient | None, str]:
        """The API client and its server's URL (none with a file and no --kubeconfig)."""
        kubernetes = self.settings.kubernetes
        if self.settings.config is None or kubernetes.kubeconfig is not None:
            # With --config, a --kubeconfig serves TokenReview only.
            return await _kubernetes().connect(kubernetes.kubeconfig)
        return None, ""

    async def _start_security(self, api_client: client.ApiClient | None) -> Security:
        default_auth = XdsAuth.NONE if self.settings.config is not None else XdsAuth.KUBERNETES
        return await Security.create(
            self.settings.security,
            _kubernetes().security(api_client) if api_client is not None else None,
            default_auth,
            shared_root=self.settings.config is None,
            observe_ca_latency=self.metrics.ca_latency.observe,
            admission=self.admission,
        )

    def _pipeline(self, security: Security, inbound: InboundGenerator) -> Pipeline:
        generators = (
            ClusterGenerator(self.index, self.cache, self.settings.build, self.stats),
            EndpointGenerator(self.index, self.cache, self.settings.build, self.stats),
            ListenerGenerator(
                self.index, self.cache, self.settings.outbound, self.settings.build, self.stats
            ),
            RouteGenerator(
                self.index, self.cache, self.settings.outbound, self.settings.build, self.stats
            ),
            inbound,
            SecretGenerator(security.secrets, self.cache, self.stats),
        )
        return Pipeline(
            self.cache,
            self.stats,
            generators,
            debounce=self.settings.debounce,
            push=self.settings.push,
            metrics=self.metrics,
            history=self.pushes,
        )

    def _source(
        self, updater: IndexUpdater, api_client: client.ApiClient | None, api_server: str
    ) -> tuple[RegistrySource, ClusterSource | None]:
        """The registry's source, and the same as a cluster source in Kubernetes mode."""
        if self.settings.config is not None:
            return FileSource(
                self.settings.config,
                updater,
                self.settings.file_poll_interval,
                self.settings.cluster_id,
                supervisor=self.supervisor,
                rejected=self.metrics.registry_file_rejected_for,
            ), None
        assert api_client is not None
        kubernetes = _kubernetes().cluster_source(
            self.settings.kubernetes,
            updater,
            api_client,
            api_server,
            self.settings.cluster_id,
            watching=self.watching,
        )
        return kubernetes, kubernetes

    def _tls(self, security: Security) -> TlsServing | None:
        if not self.settings.grpc_tls_addr:
            return None
        names = list(self.settings.tls_dns_names) or default_dns_names(
            self.settings.build.cluster_domain
        )
        return TlsServing(security.ca, names, self.settings.tls_require_client_cert)

    def _plaintext_secrets(self) -> bool:
        """Whether the plaintext port serves the CA, SDS and CSDS (with their credentials)."""
        if self.settings.plaintext_secrets is None:
            return self.settings.config is not None  # loopback development
        if self.settings.plaintext_secrets and self.settings.config is None:
            log.warning(
                "--plaintext-secrets: the CA, SDS and CSDS also answer on the plaintext port %s;"
                " tokens and private keys cross the network unencrypted",
                self.settings.grpc_addr,
            )
        return self.settings.plaintext_secrets

    def _listeners(
        self, security: Security, pipeline: Pipeline, tls: TlsServing | None
    ) -> list[Listener]:
        """The plaintext port, and the TLS port if configured.

        As in Istio, tokens and private keys travel over TLS only: in Kubernetes
        mode the plaintext port serves clusters and endpoints and asks for no
        credentials, unless --plaintext-secrets says otherwise.
        """
        everything = StreamContext(
            pipeline,
            self.stats,
            self.connections,
            security.identities,
            self.metrics,
            admission=self.admission,
        )
        readers = StatusReaders(
            self.settings.security.namespace, frozenset(self.settings.csds_trusted_accounts)
        )
        extra = (
            ExtraService(
                CSDS_SERVICE,
                csds_handler(self.proxies, security.identities, readers, self.admission),
            ),
            ExtraService(CA_SERVICE, security.ca_service.handler()),
        )
        address = self.settings.grpc_addr
        if self._plaintext_secrets():
            listeners = [Listener(address, everything, extra)]
        else:
            mesh = StreamContext(
                pipeline,
                self.stats,
                self.connections,
                metrics=self.metrics,
                # The mesh's configuration, which holds no secret: Istio's 15010 serves it all.
                served_types=frozenset(
                    {types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE}
                ),
                admission=self.admission,
            )
            listeners = [Listener(address, mesh)]
        if tls is not None:
            listeners.append(
                Listener(self.settings.grpc_tls_addr, everything, extra, tls.credentials)
            )
        return listeners

    async def start(self) -> None:
        """Serve /ready, build and start every part, sync the registry, then serve xDS."""
        await self.http.start()
        self.started = started = await self._build()
        await self._add_remote_clusters(started)
        await started.source.wait_synced()
        started.pipeline.publish_initial()
        if self.settings.freeze_heap:
            self._thresholds = collector.settle()
        self._start_tasks(started)
        await started.grpc.set_serving(True)
        self._serving = True
        log.info(
            "pilot discovery serving xDS on %s (port %d, TLS port %d), HTTP on %s:%d"
            " (event loop: %s)",
            self.settings.grpc_addr,
            started.grpc.port,
            started.grpc.tls_port,
            self.http.host,
            self.http.port,
            event_loop.running(),
        )

    async def _build(self) -> Started:
        """Every part `start` needs, built and started in order, returned whole; if one fails
        (or the start is cut short), those already started are stopped again."""
        async with contextlib.AsyncExitStack() as undo:
            api_client, api_server = await self._connect()
            if api_client is not None:
                undo.push_async_callback(api_client.close)
            security = await self._start_security(api_client)
            undo.push_async_callback(security.close)
            inbound = InboundGenerator(self.index, self.cache, self.policies, self.stats)
            pipeline = self._pipeline(security, inbound)
            tls = self._tls(security)
            grpc = GrpcServer(
                self._listeners(security, pipeline, tls),
                max_connection_age=self.settings.max_connection_age,
                drain=self.settings.drain_duration,
                pending_streams=self.settings.limits.streams,
            )
            await grpc.start()
            undo.push_async_callback(grpc.stop, self.settings.drain_duration)
            updater = IndexUpdater(
                self.index, RequestSink(pipeline.submit), self.stats, self.policies
            )
            source, kubernetes = self._source(updater, api_client, api_server)
            await source.start()
            undo.push_async_callback(source.stop)
            remotes = self._remote_clusters(updater)
            if remotes is not None:
                undo.push_async_callback(remotes.stop)
            started = Started(
                security, pipeline, inbound, grpc, source, tls, api_client, kubernetes, remotes
            )
            undo.pop_all()
            return started
        raise AssertionError("unreachable: the block returns or raises")  # for mypy

    def _start_tasks(self, started: Started) -> None:
        """The long-lived tasks, under the supervisor: push, TLS renewal, the CA's Lease and
        the root's ConfigMaps."""
        self.supervisor.start("push", started.pipeline.run)
        if started.tls is not None:
            self.supervisor.start("tls-renewal", started.tls.run)
        security = started.security
        if security.elector is not None:
            # Holds the Lease for single-writer CA duties (root creation, later rotation).
            self.supervisor.start("ca-lease", security.elector.run)
            # ConfigMap istio-ca-root-cert in every watched namespace, written by the holder.
            assert started.api_client is not None
            publisher = _kubernetes().root_publisher(
                started.api_client,
                self.settings.kubernetes,
                security.secrets.root_pem,
                security.elector,
                self.supervisor,
            )
            self.supervisor.start("ca-root-publisher", publisher.run)

    def _remote_clusters(self, updater: IndexUpdater) -> RemoteClusters | None:
        """Remote clusters, where there may be some: none with a file and no flag."""
        if self.settings.config is not None and not self.settings.remote_kubeconfigs:
            return None  # a file's mesh, no cluster: nothing to watch
        return _kubernetes().remote_clusters(
            self.settings.kubernetes,
            updater,
            self.settings.cluster_id,
            self.settings.remote,
            self.admission.hits,
            watching=self.watching,
        )

    async def _add_remote_clusters(self, started: Started) -> None:
        """The --remote-kubeconfig clusters, then (in Kubernetes mode) the Secrets' ones."""
        remotes = started.remotes
        if remotes is None:
            return
        for cluster, path in self.settings.remote_kubeconfigs:
            origin = f"--remote-kubeconfig {cluster}={path}"
            try:
                kubeconfig = path.read_text(encoding="utf-8")
            except OSError as error:
                raise OSError(f"{origin}: {error.strerror or error}") from None
            await remotes.add(cluster, kubeconfig, origin)
        if self.settings.config is None:
            assert started.api_client is not None
            self._watch_remote_secrets(started.api_client, remotes)

    def _watch_remote_secrets(self, api_client: client.ApiClient, remotes: RemoteClusters) -> None:
        """Secrets labelled istio/multiCluster in pilot's namespace add remote clusters."""
        namespace = self.settings.security.namespace
        handler, informer = _kubernetes().remote_secrets(
            api_client, remotes, namespace, self.settings.kubernetes, self.watching.faults
        )

        async def apply_remote_secrets() -> None:
            # Started again after a failure: first apply what the failed run left undone.
            handler.reconcile()
            await handler.run()

        self.supervisor.start("remote-secrets", apply_remote_secrets)
        self.supervisor.start("informer-remote-secrets", informer.run)

    async def stop(self) -> None:
        """Health goes NOT_SERVING, streams end, background work stops."""
        self._serving = False
        if self._thresholds is not None:
            collector.release(self._thresholds)
            self._thresholds = None
        started = self.started
        if started is not None:
            await started.grpc.stop(self.settings.drain_duration)
        await self.supervisor.stop()
        if started is not None:
            await started.stop()
        await self.http.stop()
