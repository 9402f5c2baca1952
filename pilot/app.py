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

Start-up (`start_discovery`, one function): on a `Core` (what exists from the settings
alone: the index, the cache, the counters, the supervisor, the HTTP port), the HTTP port
first (so `/ready` answers 503 meanwhile), then the security component (it may wait for
the shared root), the pipeline and the gRPC port (health NOT_SERVING: Envoys may connect,
and wait), then the registry; streams get their first answers only once the registry has
its first full state, so no Envoy ever receives a partial mesh. The `Discovery` it returns
has every part; if the start fails or is cut short, what had started is stopped.

Every long-lived task (each cluster's informers, the Secret reconciler, the file
poll, the push pipeline, TLS renewal, the CA lease, the root publisher) runs
under one `Supervisor`: one that fails is logged, counted, shown under `/ready`
and started again with backoff. A failing local informer does not make `/ready`
503: as in Istio, readiness is the first full sync; pilot keeps serving the last
good state, and `/ready`'s lines and `pilot_cluster_synced` say what is failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pilot.debug.csds import CSDS_SERVICE, StatusReaders, csds_handler
from pilot.debug.http import DebugState, HttpServer
from pilot.debug.metrics import Metrics, Sources, WatchCounts
from pilot.debug.proxy_status import LiveProxies
from pilot.generators.cds import ClusterGenerator
from pilot.generators.client_clusters import ClientClusters
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
from pilot.registry.authorization_policy import AuthorizationPolicies
from pilot.registry.index import EndpointIndex
from pilot.registry.peer_authentication import PeerAuthentications
from pilot.registry.request_authentication import RequestAuthentications
from pilot.registry.traffic_config import TrafficConfig
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
from pilot.webhook.reviews import reviewer
from pilot.webhook.server import WebhookServer
from pilot.webhook.serving import WebhookCertificate
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


class Core:
    """What `pilot discovery` has from its settings alone, before any part starts: the
    registry's index, the cache, the counters and limits, the supervisor, and the HTTP port
    that reports on them. `start_discovery` builds the rest on it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stats = XdsStats()
        self.index = EndpointIndex(primary=settings.cluster_id)
        self.cache = ResourceCache()
        self.policies = PeerAuthentications()  # mTLS modes per workload, read by inbound
        self.authz = AuthorizationPolicies()  # RBAC per workload, read by inbound
        self.jwt = RequestAuthentications()  # JWT verification per workload, read by inbound
        # DestinationRules and VirtualServices, read by the cluster and endpoint generators
        self.traffic = TrafficConfig(settings.build.cluster_domain)
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
            DebugState(self.proxies, self.index, self.pushes, self.traffic, self.authz, self.jwt),
            settings.debug_addr,
            ready_detail=self.cluster_lines,
            xds_ports=self.xds_ports,
        )
        # Optional, and only here: the HTTP port answers (503) before the parts exist.
        self.discovery: Discovery | None = None

    def _metric_sources(self) -> Sources:
        # Read while pilot starts too: before `start_discovery` has built the parts, none.
        def informers() -> list[WatchCounts]:
            d = self.discovery
            return list(d.cluster_source.informers) if d and d.cluster_source else []

        def remotes() -> RemoteClusters | None:
            return self.discovery.remotes if self.discovery is not None else None

        def inbound() -> InboundGenerator | None:
            return self.discovery.inbound if self.discovery is not None else None

        def security() -> Security | None:
            return self.discovery.security if self.discovery is not None else None

        def webhook() -> WebhookServer | None:
            return self.discovery.webhook if self.discovery is not None else None

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
            unsupported_config=self.traffic.unsupported_counts,
            injection=lambda: w.stats if (w := webhook()) else None,
        )

    def is_ready(self) -> bool:
        """The local registry has synced; remote clusters never hold this back."""
        return self.discovery is not None and self.discovery.is_ready()

    def cluster_statuses(self) -> dict[str, str]:
        """Cluster id -> synced, syncing or unreachable: the local cluster first."""
        if self.discovery is not None:
            return self.discovery.cluster_statuses()
        return {self.settings.cluster_id: cluster_status([], synced=False)}

    def cluster_lines(self) -> list[str]:
        """`/ready`'s detail: each cluster's status, then each failing task."""
        clusters = [f"cluster {c}: {status}" for c, status in self.cluster_statuses().items()]
        return clusters + self.supervisor.lines()

    def xds_ports(self) -> str:
        """Where xDS is, for a TLS or HTTP/2 client that came to the HTTP port instead:
        the bound ports once they are, else the flags' addresses."""
        plain, tls = self.settings.grpc_addr, self.settings.grpc_tls_addr
        if self.discovery is not None:
            grpc = self.discovery.grpc
            plain = f"port {grpc.port}"
            tls = f"port {grpc.tls_port}" if grpc.tls_port else ""
        where = f"xDS (gRPC) is {plain} (--grpc-addr)"
        return where + (f", over TLS {tls} (--grpc-tls-addr)" if tls else "")


@dataclass(frozen=True, slots=True)
class Parts:
    """What `start_discovery` builds on the core, in order, for `Discovery`.

    Optional only where a mode has none: the TLS port's serving (no --grpc-tls-addr), the
    injection webhook (--webhook-addr ''), the
    API client (a file and no --kubeconfig), the cluster source (a file), remote clusters
    (a file and no --remote-kubeconfig; they need Kubernetes' client, so no empty stand-in).
    """

    security: Security
    pipeline: Pipeline
    inbound: InboundGenerator
    grpc: GrpcServer
    source: RegistrySource
    tls: TlsServing | None
    api_client: client.ApiClient | None
    cluster_source: ClusterSource | None  # the source, in Kubernetes mode
    remotes: RemoteClusters | None
    webhook: WebhookServer | None


class Discovery:
    """A running control plane, built whole by `start_discovery`; `stop` stops it.

    The core's parts (stats, index, cache, connections, http, ...) and the built ones
    (security, pipeline, inbound, grpc, source, ...) under their own names.
    """

    def __init__(self, core: Core, parts: Parts) -> None:
        self.settings = core.settings
        self.stats = core.stats
        self.index = core.index
        self.cache = core.cache
        self.policies = core.policies
        self.traffic = core.traffic
        self.connections = core.connections
        self.admission = core.admission
        self.proxies = core.proxies
        self.pushes = core.pushes
        self.supervisor = core.supervisor
        self.watching = core.watching
        self.metrics = core.metrics
        self.http = core.http
        self.security = parts.security
        self.pipeline = parts.pipeline
        self.inbound = parts.inbound
        self.grpc = parts.grpc
        self.source = parts.source
        self.tls = parts.tls
        self.api_client = parts.api_client
        self.cluster_source = parts.cluster_source
        self.remotes = parts.remotes
        self.webhook = parts.webhook
        self._serving = False
        self._thresholds: tuple[int, int, int] | None = None  # the collector's, if frozen

    def is_ready(self) -> bool:
        """The local registry has synced; remote clusters never hold this back."""
        return self._serving and self.source.synced

    def cluster_statuses(self) -> dict[str, str]:
        """Cluster id -> synced, syncing or unreachable: the local cluster first."""
        informers = self.cluster_source.informers if self.cluster_source is not None else []
        local = cluster_status(informers, self.source.synced)
        statuses = self.remotes.statuses() if self.remotes is not None else {}
        return {self.settings.cluster_id: local} | statuses

    async def stop(self) -> None:
        """Health goes NOT_SERVING, streams end, background work stops, then the sources,
        the clients and the HTTP port."""
        self._serving = False
        if self._thresholds is not None:
            collector.release(self._thresholds)
            self._thresholds = None
        await self.grpc.stop(self.settings.drain_duration)
        await self.supervisor.stop()
        await self.source.stop()
        if self.remotes is not None:
            await self.remotes.stop()
        await self.security.close()
        if self.webhook is not None:
            await self.webhook.stop()
        if self.api_client is not None:
            await self.api_client.close()
        await self.http.stop()


async def start_discovery(core: Core) -> Discovery:
    """Serve /ready (503 meanwhile), build and start every part in order, sync the
    registry, then serve xDS. If a part fails, or the start is cut short (a signal), what
    had started is stopped again: no port stays bound, no task runs."""
    undo = contextlib.AsyncExitStack()
    try:
        await core.http.start()
        undo.push_async_callback(core.http.stop)
        undo.push_async_callback(core.supervisor.stop)  # the sources' tasks run under it
        parts = await _build(core, undo)
        core.discovery = discovery = Discovery(core, parts)
        undo.pop_all()
        undo.push_async_callback(discovery.stop)  # from here, it stops it all
        await _serve(discovery)
    except BaseException:
        await _undo(undo)
        raise
    return discovery


async def _undo(undo: contextlib.AsyncExitStack) -> None:
    """Stop what a failed start had started, in a task of its own: a start cut short is a
    cancelled task, and a cancelled stopper's stops let its cancellation through half-way
    (the supervisor's do, so that its own stop can be cut short)."""
    await asyncio.shield(asyncio.create_task(undo.aclose(), name="undo-start"))


async def _build(core: Core, undo: contextlib.AsyncExitStack) -> Parts:
    """Every part, built and started in order; each one started is pushed onto `undo`."""
    settings = core.settings
    api_client, api_server = await _connect(settings)
    if api_client is not None:
        undo.push_async_callback(api_client.close)
    security = await _start_security(core, api_client)
    undo.push_async_callback(security.close)
    webhook = await _start_webhook(core, security, api_client)
    if webhook is not None:
        undo.push_async_callback(webhook.stop)
    inbound = InboundGenerator(
        core.index,
        core.cache,
        core.policies,
        core.stats,
        core.authz,
        jwt=core.jwt,
        normalization=settings.build.path_normalization,
    )
    pipeline = _pipeline(core, security, inbound)
    tls = _tls(settings, security)
    grpc = GrpcServer(
        _listeners(core, security, pipeline, tls),
        max_connection_age=settings.max_connection_age,
        drain=settings.drain_duration,
        pending_streams=settings.limits.streams,
    )
    await grpc.start()
    undo.push_async_callback(grpc.stop, settings.drain_duration)
    updater = IndexUpdater(
        core.index,
        RequestSink(pipeline.submit),
        core.stats,
        core.policies,
        core.traffic,
        authz=core.authz,
        jwt=core.jwt,
    )
    source, cluster_source = _source(core, updater, api_client, api_server)
    await source.start()
    undo.push_async_callback(source.stop)
    remotes = _remote_clusters(core, updater)
    if remotes is not None:
        undo.push_async_callback(remotes.stop)
    return Parts(
        security,
        pipeline,
        inbound,
        grpc,
        source,
        tls,
        api_client,
        cluster_source,
        remotes,
        webhook,
    )


async def _serve(discovery: Discovery) -> None:
    """Remote clusters, the registry's first full state, the long-lived tasks, then
    health SERVING: streams get their first answers only now."""
    settings = discovery.settings
    await _add_remote_clusters(discovery)
    await discovery.source.wait_synced()
    discovery.pipeline.publish_initial()
    if settings.freeze_heap:
        discovery._thresholds = collector.settle()
    _start_tasks(discovery)
    await discovery.grpc.set_serving(True)
    discovery._serving = True
    log.info(
        "pilot discovery serving xDS on %s (port %d, TLS port %d), HTTP on %s:%d (event loop: %s)",
        settings.grpc_addr,
        discovery.grpc.port,
        discovery.grpc.tls_port,
        discovery.http.host,
        discovery.http.port,
        event_loop.running(),
    )


async def _connect(settings: Settings) -> tuple[client.ApiClient | None, str]:
    """The API client and its server's URL (none with a file and no --kubeconfig)."""
    kubernetes = settings.kubernetes
    if settings.config is None or kubernetes.kubeconfig is not None:
        # With --config, a --kubeconfig serves TokenReview only.
        return await _kubernetes().connect(kubernetes.kubeconfig)
    return None, ""


async def _start_security(core: Core, api_client: client.ApiClient | None) -> Security:
    settings = core.settings
    default_auth = XdsAuth.NONE if settings.config is not None else XdsAuth.KUBERNETES
    return await Security.create(
        settings.security,
        _kubernetes().security(api_client) if api_client is not None else None,
        default_auth,
        shared_root=settings.config is None,
        observe_ca_latency=core.metrics.ca_latency.observe,
        admission=core.admission,
    )


def _pipeline(core: Core, security: Security, inbound: InboundGenerator) -> Pipeline:
    settings = core.settings
    clusters = ClusterGenerator(core.index, core.cache, settings.build, core.stats, core.traffic)
    endpoints = EndpointGenerator(core.index, core.cache, settings.build, core.stats, core.traffic)
    generators = (
        clusters,
        endpoints,
        ClientClusters(core.index, core.cache, core.traffic, (clusters, endpoints), core.stats),
        ListenerGenerator(
            core.index,
            core.cache,
            settings.outbound,
            settings.build,
            core.stats,
            traffic=core.traffic,
        ),
        RouteGenerator(
            core.index,
            core.cache,
            settings.outbound,
            settings.build,
            core.stats,
            traffic=core.traffic,
        ),
        inbound,
        SecretGenerator(security.secrets, core.cache, core.stats),
    )
    return Pipeline(
        core.cache,
        core.stats,
        generators,
        debounce=settings.debounce,
        push=settings.push,
        metrics=core.metrics,
        history=core.pushes,
    )


def _source(
    core: Core, updater: IndexUpdater, api_client: client.ApiClient | None, api_server: str
) -> tuple[RegistrySource, ClusterSource | None]:
    """The registry's source, and the same as a cluster source in Kubernetes mode."""
    settings = core.settings
    if settings.config is not None:
        return FileSource(
            settings.config,
            updater,
            settings.file_poll_interval,
            settings.cluster_id,
            cluster_domain=settings.build.cluster_domain,
            supervisor=core.supervisor,
            rejected=core.metrics.registry_file_rejected_for,
        ), None
    assert api_client is not None
    cluster_source = _kubernetes().cluster_source(
        settings.kubernetes,
        updater,
        api_client,
        api_server,
        settings.cluster_id,
        watching=core.watching,
        cluster_domain=settings.build.cluster_domain,
    )
    return cluster_source, cluster_source


def _dns_names(settings: Settings) -> list[str]:
    """The names pilot's serving certificates carry (the TLS port's, the webhook's)."""
    return list(settings.tls_dns_names) or default_dns_names(settings.build.cluster_domain)


def _tls(settings: Settings, security: Security) -> TlsServing | None:
    if not settings.grpc_tls_addr:
        return None
    return TlsServing(security.ca, _dns_names(settings), settings.tls_require_client_cert)


async def _start_webhook(
    core: Core, security: Security, api_client: client.ApiClient | None
) -> WebhookServer | None:
    """The injection webhook (none with --webhook-addr ''), serving at once: Pods are
    admitted while the registry syncs. Its certificate's renewal and, in Kubernetes mode,
    the caBundle of pilot's webhook configuration are supervised tasks from now on."""
    settings = core.settings
    if not settings.webhook.address:
        return None
    certificate = WebhookCertificate(security.ca, _dns_names(settings))
    webhook = WebhookServer(settings.webhook, certificate, reviewer(settings.inject))
    await webhook.start()
    core.supervisor.start("webhook-renewal", certificate.run)
    if api_client is not None and settings.config is None:
        keeper = _kubernetes().ca_bundle_keeper(
            api_client,
            settings.kubernetes,
            settings.webhook.configuration,
            lambda: security.ca.root_pem,
            core.supervisor,
        )
        core.supervisor.start("webhook-ca-bundle", keeper.run)
    return webhook


def _plaintext_secrets(settings: Settings) -> bool:
    """Whether the plaintext port serves the CA, SDS and CSDS (with their credentials)."""
    if settings.plaintext_secrets is None:
        return settings.config is not None  # loopback development
    if settings.plaintext_secrets and settings.config is None:
        log.warning(
            "--plaintext-secrets: the CA, SDS and CSDS also answer on the plaintext port %s;"
            " tokens and private keys cross the network unencrypted",
            settings.grpc_addr,
        )
    return settings.plaintext_secrets


def _listeners(
    core: Core, security: Security, pipeline: Pipeline, tls: TlsServing | None
) -> list[Listener]:
    """The plaintext port, and the TLS port if configured.

    As in Istio, tokens and private keys travel over TLS only: in Kubernetes
    mode the plaintext port serves clusters and endpoints and asks for no
    credentials, unless --plaintext-secrets says otherwise.
    """
    settings = core.settings
    everything = StreamContext(
        pipeline,
        core.stats,
        core.connections,
        security.identities,
        core.metrics,
        admission=core.admission,
    )
    readers = StatusReaders(settings.security.namespace, frozenset(settings.csds_trusted_accounts))
    extra = (
        ExtraService(
            CSDS_SERVICE,
            csds_handler(core.proxies, security.identities, readers, core.admission),
        ),
        ExtraService(CA_SERVICE, security.ca_service.handler()),
    )
    address = settings.grpc_addr
    if _plaintext_secrets(settings):
        listeners = [Listener(address, everything, extra)]
    else:
        mesh = StreamContext(
            pipeline,
            core.stats,
            core.connections,
            metrics=core.metrics,
            # The mesh's configuration, which holds no secret: Istio's 15010 serves it all.
            served_types=frozenset({types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE}),
            admission=core.admission,
        )
        listeners = [Listener(address, mesh)]
    if tls is not None:
        listeners.append(Listener(settings.grpc_tls_addr, everything, extra, tls.credentials))
    return listeners


def _remote_clusters(core: Core, updater: IndexUpdater) -> RemoteClusters | None:
    """Remote clusters, where there may be some: none with a file and no flag."""
    settings = core.settings
    if settings.config is not None and not settings.remote_kubeconfigs:
        return None  # a file's mesh, no cluster: nothing to watch
    return _kubernetes().remote_clusters(
        settings.kubernetes,
        updater,
        settings.cluster_id,
        settings.remote,
        core.admission.hits,
        watching=core.watching,
    )


async def _add_remote_clusters(discovery: Discovery) -> None:
    """The --remote-kubeconfig clusters, then (in Kubernetes mode) the Secrets' ones."""
    remotes, settings = discovery.remotes, discovery.settings
    if remotes is None:
        return
    for cluster, path in settings.remote_kubeconfigs:
        origin = f"--remote-kubeconfig {cluster}={path}"
        try:
            kubeconfig = path.read_text(encoding="utf-8")
        except OSError as error:
            raise OSError(f"{origin}: {error.strerror or error}") from None
        await remotes.add(cluster, kubeconfig, origin)
    if settings.config is None:
        assert discovery.api_client is not None
        _watch_remote_secrets(discovery, discovery.api_client, remotes)


def _watch_remote_secrets(
    discovery: Discovery, api_client: client.ApiClient, remotes: RemoteClusters
) -> None:
    """Secrets labelled istio/multiCluster in pilot's namespace add remote clusters."""
    settings = discovery.settings
    handler, informer = _kubernetes().remote_secrets(
        api_client,
        remotes,
        settings.security.namespace,
        settings.kubernetes,
        discovery.watching.faults,
    )

    async def apply_remote_secrets() -> None:
        # Started again after a failure: first apply what the failed run left undone.
        handler.reconcile()
        await handler.run()

    discovery.supervisor.start("remote-secrets", apply_remote_secrets)
    discovery.supervisor.start("informer-remote-secrets", informer.run)


def _start_tasks(discovery: Discovery) -> None:
    """The long-lived tasks, under the supervisor: push, TLS renewal, the CA's Lease and
    the root's ConfigMaps."""
    supervisor, security = discovery.supervisor, discovery.security
    supervisor.start("push", discovery.pipeline.run)
    if discovery.tls is not None:
        supervisor.start("tls-renewal", discovery.tls.run)
    if security.elector is not None:
        # Holds the Lease for single-writer CA duties (root creation, later rotation).
        supervisor.start("ca-lease", security.elector.run)
        # ConfigMap istio-ca-root-cert in every watched namespace, written by the holder.
        assert discovery.api_client is not None
        publisher = _kubernetes().root_publisher(
            discovery.api_client,
            discovery.settings.kubernetes,
            security.secrets.root_pem,
            security.elector,
            supervisor,
        )
        supervisor.start("ca-root-publisher", publisher.run)
