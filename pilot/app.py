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

import logging
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
from pilot.kube.informer import Informer, Watching, cluster_status
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

    from pilot.sources.kubernetes.cluster_source import ClusterSource
    from pilot.sources.kubernetes.clusters import RemoteClusters

# Kubernetes' client (kubernetes_asyncio) takes 0.7 s to import, about half of a start
# from a file, which never calls it: what needs it is imported where it is first used.

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
        self.api_client: client.ApiClient | None = None
        self._api_server = ""
        self.security: Security | None = None
        self.pipeline: Pipeline | None = None
        self.inbound: InboundGenerator | None = None
        self.source: RegistrySource | None = None
        self._kubernetes: ClusterSource | None = None  # the source, in Kubernetes mode
        self.remotes: RemoteClusters | None = None
        self.remote_secrets: Informer | None = None
        self._grpc: GrpcServer | None = None
        self._serving = False
        self._thresholds: tuple[int, int, int] | None = None  # the collector's, once settled

    @property
    def grpc(self) -> GrpcServer:
        assert self._grpc is not None, "pilot has not started"
        return self._grpc

    def _metric_sources(self) -> Sources:
        def informers() -> list[WatchCounts]:
            return list(self._kubernetes.informers) if self._kubernetes is not None else []

        return Sources(
            stats=self.stats,
            connections=lambda: len(self.connections),
            services=lambda: len(self.index.services),
            inbound_shapes=lambda: self.inbound.shapes if self.inbound is not None else 0,
            inbound_failed_closed=lambda: self.inbound.failed_closed if self.inbound else 0,
            secret_stats=lambda: self.security.secrets.stats if self.security else None,
            ca_stats=lambda: self.security.ca_service.stats if self.security else None,
            limit_hits=lambda: self.admission.hits.counts,
            informers=informers,
            clusters=lambda: {c: s == "synced" for c, s in self.cluster_statuses().items()},
            remote_clusters=lambda: len(self.remotes) if self.remotes is not None else 0,
            remote_refusals=lambda: self.remotes.refusals if self.remotes is not None else {},
            remote_insecure=lambda: self.remotes.insecure() if self.remotes is not None else 0,
            task_failures=lambda: self.supervisor.failures,
            watch_faults=lambda: self.watching.faults.counts,
        )

    def is_ready(self) -> bool:
        """The local registry has synced; remote clusters never hold this back."""
        return self._serving and self.source is not None and self.source.synced

    def cluster_statuses(self) -> dict[str, str]:
        """Cluster id -> synced, syncing or unreachable: the local cluster first."""
        source, kubernetes = self.source, self._kubernetes
        informers = kubernetes.informers if kubernetes is not None else []
        local = cluster_status(informers, source is not None and source.synced)
        remotes = self.remotes.statuses() if self.remotes is not None else {}
        return {self.settings.cluster_id: local} | remotes

    def cluster_lines(self) -> list[str]:
        """`/ready`'s detail: each cluster's status, then each failing task."""
        clusters = [f"cluster {c}: {status}" for c, status in self.cluster_statuses().items()]
        return clusters + self.supervisor.lines()

    def xds_ports(self) -> str:
        """Where xDS is, for a TLS or HTTP/2 client that came to the HTTP port instead:
        the bound ports once they are, else the flags' addresses."""
        plain, tls = self.settings.grpc_addr, self.settings.grpc_tls_addr
        if self._grpc is not None:
            plain = f"port {self.grpc.port}"
            tls = f"port {self.grpc.tls_port}" if self.grpc.tls_port else ""
        where = f"xDS (gRPC) is {plain} (--grpc-addr)"
        return where + (f", over TLS {tls} (--grpc-tls-addr)" if tls else "")

    async def _connect(self) -> None:
        kubernetes = self.settings.kubernetes
        if self.settings.config is None or kubernetes.kubeconfig is not None:
            # With --config, a --kubeconfig serves TokenReview only.
            from pilot.kube.connection import connect  # noqa: PLC0415

            self.api_client, self._api_server = await connect(kubernetes.kubeconfig)

    async def _start_security(self) -> Security:
        default_auth = XdsAuth.NONE if self.settings.config is not None else XdsAuth.KUBERNETES
        return await Security.create(
            self.settings.security,
            self.api_client,
            default_auth,
            shared_root=self.settings.config is None,
            observe_ca_latency=self.metrics.ca_latency.observe,
            admission=self.admission,
        )

    def _pipeline(self, security: Security) -> Pipeline:
        self.inbound = InboundGenerator(self.index, self.cache, self.policies, self.stats)
        generators = (
            ClusterGenerator(self.index, self.cache, self.settings.build, self.stats),
            EndpointGenerator(self.index, self.cache, self.settings.build, self.stats),
            ListenerGenerator(
                self.index, self.cache, self.settings.outbound, self.settings.build, self.stats
            ),
            RouteGenerator(
                self.index, self.cache, self.settings.outbound, self.settings.build, self.stats
            ),
            self.inbound,
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

    def _source(self, updater: IndexUpdater) -> RegistrySource:
        if self.settings.config is not None:
            return FileSource(
                self.settings.config,
                updater,
                self.settings.file_poll_interval,
                self.settings.cluster_id,
                supervisor=self.supervisor,
                rejected=self.metrics.registry_file_rejected_for,
            )
        assert self.api_client is not None
        from pilot.sources.kubernetes.cluster_source import ClusterSource  # noqa: PLC0415

        self._kubernetes = ClusterSource(
            self.settings.kubernetes,
            updater,
            self.api_client,
            self._api_server,
            self.settings.cluster_id,
            watching=self.watching,
            peer_authentications=True,  # Istio's config comes from the local cluster only
        )
        return self._kubernetes

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
        """Serve /ready, sync the registry, then serve xDS."""
        await self.http.start()
        await self._connect()
        self.security = security = await self._start_security()
        self.pipeline = pipeline = self._pipeline(security)
        tls = self._tls(security)
        self._grpc = GrpcServer(
            self._listeners(security, pipeline, tls),
            max_connection_age=self.settings.max_connection_age,
            drain=self.settings.drain_duration,
            pending_streams=self.settings.limits.streams,
        )
        await self.grpc.start()
        updater = IndexUpdater(self.index, RequestSink(pipeline.submit), self.stats, self.policies)
        self.source = self._source(updater)
        await self.source.start()
        await self._start_remotes(updater)
        await self.source.wait_synced()
        pipeline.publish_initial()
        if self.settings.freeze_heap:
            self._thresholds = collector.settle()
        self.supervisor.start("push", pipeline.run)
        if tls is not None:
            self.supervisor.start("tls-renewal", tls.run)
        if security.elector is not None:
            # Holds the Lease for single-writer CA duties (root creation, later rotation).
            self.supervisor.start("ca-lease", security.elector.run)
            # ConfigMap istio-ca-root-cert in every watched namespace, written by the holder.
            assert self.api_client is not None
            from pilot.security.root_publisher import RootPublisher  # noqa: PLC0415

            publisher = RootPublisher(
                self.api_client,
                self.settings.kubernetes,
                security.secrets.root_pem,
                security.elector,
                supervisor=self.supervisor,
            )
            self.supervisor.start("ca-root-publisher", publisher.run)
        await self.grpc.set_serving(True)
        self._serving = True
        log.info(
            "pilot discovery serving xDS on %s (port %d, TLS port %d), HTTP on %s:%d"
            " (event loop: %s)",
            self.settings.grpc_addr,
            self.grpc.port,
            self.grpc.tls_port,
            self.http.host,
            self.http.port,
            event_loop.running(),
        )

    async def _start_remotes(self, updater: IndexUpdater) -> None:
        """The --remote-kubeconfig clusters, then (in Kubernetes mode) the Secrets' ones."""
        if self.settings.config is not None and not self.settings.remote_kubeconfigs:
            return  # a file's mesh, no cluster: nothing to watch
        from pilot.sources.kubernetes import clusters  # noqa: PLC0415

        self.remotes = clusters.RemoteClusters(
            self.settings.kubernetes,
            updater,
            self.settings.cluster_id,
            self.settings.remote,
            self.admission.hits,
            watching=self.watching,
        )
        for cluster, path in self.settings.remote_kubeconfigs:
            origin = f"--remote-kubeconfig {cluster}={path}"
            try:
                kubeconfig = path.read_text(encoding="utf-8")
            except OSError as error:
                raise OSError(f"{origin}: {error.strerror or error}") from None
            await self.remotes.add(cluster, kubeconfig, origin)
        if self.settings.config is None:
            assert self.api_client is not None
            namespace = self.settings.security.namespace
            handler = clusters.RemoteSecrets(self.remotes, namespace)
            self.remote_secrets = clusters.secret_informer(
                self.api_client,
                namespace,
                handler,
                self.settings.kubernetes,
                self.watching.faults,
            )

            async def apply_remote_secrets() -> None:
                # Started again after a failure: first apply what the failed run left undone.
                handler.reconcile()
                await handler.run()

            self.supervisor.start("remote-secrets", apply_remote_secrets)
            self.supervisor.start("informer-remote-secrets", self.remote_secrets.run)

    async def stop(self) -> None:
        """Health goes NOT_SERVING, streams end, background work stops."""
        self._serving = False
        if self._thresholds is not None:
            collector.release(self._thresholds)
            self._thresholds = None
        if self._grpc is not None:
            await self._grpc.stop(self.settings.drain_duration)
        await self.supervisor.stop()
        if self.source is not None:
            await self.source.stop()
        if self.remotes is not None:
            await self.remotes.stop()
        if self.security is not None:
            await self.security.close()
        if self.api_client is not None:
            await self.api_client.close()
        await self.http.stop()
