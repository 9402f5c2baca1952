"""Prometheus metrics, with Istio's names where one exists.

Counters pilot keeps anyway (XdsStats, SecretStats, informer counters) are read
at scrape time by `PilotCollector`; histograms are observed where things
happen. Labels are bounded (xDS type, Kubernetes kind, the cluster ids an
operator configured): never a proxy id. Each `Metrics` has its own registry, so
several pilots can live in one process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

from pilot.debug.loop_histogram import LoopHistogram, Series
from pilot.security.ca_service import CaStats
from pilot.security.secrets import SecretStats
from pilot.stats import XdsStats
from pilot.webhook.refusals import KINDS as INJECTION_REFUSALS
from pilot.webhook.refusals import InjectionStats
from pilot.xds import types

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_CA_COUNTERS = (
    "csr_count",
    "success_cert_issuance_count",
    "authentication_failure_count",
    "csr_error_count",
)
_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BYTES = (1_000, 10_000, 100_000, 1_000_000, 10_000_000)


class WatchCounts(Protocol):
    """An informer's counters."""

    @property
    def kind(self) -> str: ...

    @property
    def watch_restarts(self) -> int: ...

    @property
    def relists(self) -> int: ...

    @property
    def bookmarks(self) -> int: ...


def running_tasks() -> int:
    """asyncio tasks of the running event loop (0 outside one)."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:
        return 0


@dataclass
class Sources:
    """Where the collector reads current values; filled in as components start."""

    stats: XdsStats
    connections: Callable[[], int] = lambda: 0
    services: Callable[[], int] = lambda: 0
    # Sidecars' inbound listener shapes held, and those given the strictest modes because
    # their workload could not be told (PeerAuthentication failing closed).
    inbound_shapes: Callable[[], int] = lambda: 0
    inbound_failed_closed: Callable[[], int] = lambda: 0
    secret_stats: Callable[[], SecretStats | None] = lambda: None
    informers: Callable[[], Iterable[WatchCounts]] = lambda: ()
    ca_stats: Callable[[], CaStats | None] = lambda: None
    limit_hits: Callable[[], Mapping[str, int]] = lambda: {}
    # Cluster id -> synced and reachable, the local cluster first; then the remote count.
    clusters: Callable[[], Mapping[str, bool]] = lambda: {}
    remote_clusters: Callable[[], int] = lambda: 0
    # Refused remote cluster keys by reason (conflict, invalid_id, kubeconfig, ...).
    remote_refusals: Callable[[], Mapping[str, int]] = lambda: {}
    # Remote clusters watched through a kubeconfig with insecure-skip-tls-verify.
    remote_insecure: Callable[[], int] = lambda: 0
    tasks: Callable[[], int] = running_tasks
    # Supervised task name -> its failures (pilot's own names and cluster ids: bounded).
    task_failures: Callable[[], Mapping[str, int]] = lambda: {}
    # (cluster id, kind, reason) -> what API servers sent that was skipped or refused.
    watch_faults: Callable[[], Mapping[tuple[str, str, str], int]] = lambda: {}
    # Istio kind -> objects held of kinds pilot does not implement (a bounded list of kinds).
    unsupported_config: Callable[[], Mapping[str, int]] = lambda: {}
    # The sidecar-injection webhook's counts (None while it does not run).
    injection: Callable[[], InjectionStats | None] = lambda: None


def _istio_counter(
    name: str, documentation: str, value: float | None = None, labels: list[str] | None = None
) -> UnknownMetricFamily:
    """A counter under Istio's exact name (prometheus-client would append `_total`)."""
    return UnknownMetricFamily(name, documentation, value=value, labels=labels)


def _by_type(name: str, documentation: str, counts: dict[str, int]) -> UnknownMetricFamily:
    family = _istio_counter(name, documentation, labels=["type"])
    for type_url, count in sorted(counts.items()):
        family.add_metric([types.short_name(type_url)], count)
    return family


class PilotCollector(Collector):
    """Exports pilot's own counters and gauges at scrape time."""

    def __init__(self, sources: Sources) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        yield from self._xds()
        yield from self._security()
        yield from self._kubernetes()
        yield self._limits()
        yield self._task_failures()
        yield from self._injection()

    def _injection(self) -> Iterator[Metric]:
        """Istio's injector counters, and pilot's refusals by kind (every kind, from 0)."""
        stats = self._sources.injection() or InjectionStats()
        for name, value, documentation in (
            ("requests", stats.requests, "Requests to the injection webhook (POST /inject)."),
            ("success", stats.success, "Reviews answered with the Pod allowed."),
            ("skip", stats.skip, "Reviews answered without injecting (not selected)."),
            ("failure", stats.failure, "Reviews refused, or answered with the Pod refused."),
        ):
            yield CounterMetricFamily(f"sidecar_injection_{name}", documentation, value=value)
        refusals = CounterMetricFamily(
            "pilot_injection_refusals",
            "Requests the injection webhook refused or answered with the Pod refused, by kind.",
            labels=["reason"],
        )
        for kind in INJECTION_REFUSALS:
            refusals.add_metric([kind], stats.refusals.get(kind, 0))
        yield refusals

    def _task_failures(self) -> Metric:
        failures = CounterMetricFamily(
            "pilot_task_failures",
            "Long-lived tasks that raised (or returned) and were started again, by task.",
            labels=["task"],
        )
        for task, count in sorted(self._sources.task_failures().items()):
            failures.add_metric([task], count)
        return failures

    def _limits(self) -> Metric:
        hits = CounterMetricFamily(
            "pilot_limit_hits",
            "Requests refused, or answers forgotten, because a limit was reached.",
            labels=["limit"],
        )
        for limit, count in sorted(self._sources.limit_hits().items()):
            hits.add_metric([limit], count)
        return hits

    def _xds(self) -> Iterator[Metric]:
        stats = self._sources.stats
        yield GaugeMetricFamily(
            "pilot_xds", "Connected xDS streams.", value=self._sources.connections()
        )
        yield GaugeMetricFamily(
            "pilot_services", "Services in the registry.", value=self._sources.services()
        )
        yield GaugeMetricFamily(
            "pilot_inbound_shapes",
            "Distinct inbound listeners held for connected sidecars (each shared by shape).",
            value=self._sources.inbound_shapes(),
        )
        yield GaugeMetricFamily(
            "pilot_route_flavors",
            "Route configuration flavors held for sidecars whose routes depend on their"
            " namespace or labels (each shared by every sidecar reading alike).",
            value=stats.route_flavors,
        )
        yield GaugeMetricFamily(
            "pilot_cluster_flavors",
            "Cluster and assignment tables held for the sidecars of namespaces that follow"
            " DestinationRules of their own (one per namespace, and per locality).",
            value=stats.cluster_flavors,
        )
        yield CounterMetricFamily(
            "pilot_route_flavors_refused",
            "Times a sidecar whose routes depend on who it is was given the shared routes:"
            " PILOT_MAX_ROUTE_FLAVORS flavors were held.",
            value=stats.route_flavors_refused,
        )
        yield CounterMetricFamily(
            "pilot_inbound_failed_closed",
            "Sidecar inbound shapes given the strictest modes workload PeerAuthentications"
            " could give, their Pod not known.",
            value=self._sources.inbound_failed_closed(),
        )
        yield CounterMetricFamily(
            "pilot_reserved_ports",
            "Service ports given no outbound listener or route: the sidecar keeps them for"
            " itself (15000, 15001, 15006, 15020, 15021, 15090).",
            value=stats.reserved_ports,
        )
        yield GaugeMetricFamily(
            "pilot_asyncio_tasks",
            "asyncio tasks in pilot's event loop.",
            value=self._sources.tasks(),
        )
        yield _by_type("pilot_xds_pushes", "xDS responses sent, by type.", dict(stats.responses))
        rejects = sum(stats.nacks.values())
        yield _istio_counter("pilot_total_xds_rejects", "xDS responses rejected.", value=rejects)
        for type_url in types.PUSH_ORDER:  # Istio's pilot_xds_{cds,eds,lds,rds}_reject
            short = types.short_name(type_url)
            yield _istio_counter(
                f"pilot_xds_{short}_reject",
                f"{short} responses rejected.",
                value=stats.nacks[type_url],
            )
        yield _by_type(
            "pilot_xds_expired_nonce", "Requests with a stale nonce.", dict(stats.stale_nonces)
        )
        updates = _istio_counter(
            "pilot_inbound_updates", "Registry changes received.", labels=["type"]
        )
        for kind, count in sorted(stats.inbound_updates.items()):
            updates.add_metric([kind], count)
        yield updates
        serialized = CounterMetricFamily(
            "pilot_xds_serializations", "Resources serialized (once per version).", labels=["type"]
        )
        for type_url, count in sorted(stats.serializations.items()):
            serialized.add_metric([types.short_name(type_url)], count)
        yield serialized
        yield from self._config()

    def _config(self) -> Iterator[Metric]:
        rejected = CounterMetricFamily(
            "pilot_config_rejected",
            "Istio objects (DestinationRule, VirtualService, RequestAuthentication) refused as"
            " invalid, by kind:"
            " the last good version of each keeps serving.",
            labels=["kind"],
        )
        for kind, count in sorted(self._sources.stats.config_rejected.items()):
            rejected.add_metric([kind], count)
        yield rejected
        unsupported = GaugeMetricFamily(
            "pilot_config_unsupported",
            "Istio objects of kinds pilot does not implement, held now, by kind.",
            labels=["kind"],
        )
        for kind, count in sorted(self._sources.unsupported_config().items()):
            unsupported.add_metric([kind], count)
        yield unsupported
        yield CounterMetricFamily(
            "pilot_authz_failed_closed",
            "AuthorizationPolicies received with a part pilot cannot translate: that part"
            " denies what it would otherwise have allowed (see the warning line).",
            value=self._sources.stats.authz_failed_closed,
        )

    def _security(self) -> Iterator[Metric]:
        secrets = self._sources.secret_stats()
        if secrets is not None:
            for name in ("minted", "rotated", "dropped"):
                yield CounterMetricFamily(
                    f"pilot_sds_certs_{name}",
                    f"Workload certificates {name}.",
                    value=getattr(secrets, name),
                )
            yield CounterMetricFamily(
                "pilot_sds_ca_errors",
                "Failed CA requests for workload certificates.",
                value=secrets.ca_errors,
            )
        ca = self._sources.ca_stats()
        if ca is not None:
            for name in _CA_COUNTERS:
                yield _istio_counter(
                    f"citadel_server_{name}", f"pilot's CA: {name}.", value=getattr(ca, name)
                )

    def _kubernetes(self) -> Iterator[Metric]:
        restarts = CounterMetricFamily(
            "pilot_k8s_watch_restarts", "Watches started again.", labels=["kind"]
        )
        relists = CounterMetricFamily(
            "pilot_k8s_relists", "Relists after 410 Expired.", labels=["kind"]
        )
        bookmarks = CounterMetricFamily(
            "pilot_k8s_watch_bookmarks",
            "Bookmarks API servers sent: where a watch resumes, kept current without events.",
            labels=["kind"],
        )
        for informer in self._sources.informers():
            restarts.add_metric([informer.kind], informer.watch_restarts)
            relists.add_metric([informer.kind], informer.relists)
            bookmarks.add_metric([informer.kind], informer.bookmarks)
        yield restarts
        yield relists
        yield bookmarks
        rejected = CounterMetricFamily(
            "pilot_k8s_rejected",
            "What API servers sent that pilot skipped or refused: lines that are not JSON"
            " objects, events of no known type, objects of another kind, without a name,"
            " without a field Kubernetes requires (missing_field) or that do not parse,"
            " watch events and list pages over their bound.",
            labels=["cluster_id", "kind", "reason"],
        )
        for (cluster, kind, reason), count in sorted(self._sources.watch_faults().items()):
            rejected.add_metric([cluster, kind, reason], count)
        yield rejected
        synced = GaugeMetricFamily(
            "pilot_cluster_synced",
            "1 while a cluster's informers have listed and reach its API server, else 0.",
            labels=["cluster_id"],
        )
        for cluster, healthy in self._sources.clusters().items():
            synced.add_metric([cluster], 1 if healthy else 0)
        yield synced
        yield GaugeMetricFamily(
            "pilot_remote_clusters",
            "Remote clusters watched (--remote-kubeconfig and multi-cluster Secrets).",
            value=self._sources.remote_clusters(),
        )
        refusals = CounterMetricFamily(
            "pilot_remote_cluster_refusals",
            "Remote cluster keys refused (each refused value once), by reason.",
            labels=["reason"],
        )
        for reason, count in sorted(self._sources.remote_refusals().items()):
            refusals.add_metric([reason], count)
        yield refusals
        yield GaugeMetricFamily(
            "pilot_remote_clusters_insecure_skip_tls_verify",
            "Remote clusters watched through a kubeconfig that skips verifying the API"
            " server's certificate (insecure-skip-tls-verify).",
            value=self._sources.remote_insecure(),
        )


class Metrics:
    """pilot's registry: histograms observed in place, counters collected from stats."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self.registry = CollectorRegistry()
        self.registry.register(PilotCollector(sources))
        # Observed for every response written: counted on the loop, shaped when scraped.
        self.push_time = LoopHistogram(
            "pilot_xds_push_time", "Time to build and write one xDS response.", _SECONDS, "type"
        )
        self.convergence = LoopHistogram(
            "pilot_proxy_convergence_time",
            "From a change reaching pilot to the response that carries it being written.",
            _SECONDS,
        )
        self.debounce = Histogram(
            "pilot_debounce_time",
            "From the first change of a debounce window to its push.",
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.config_size = LoopHistogram(
            "pilot_xds_config_size_bytes", "Size of xDS responses.", _BYTES, "type"
        )
        self._per_type: dict[str, tuple[Series, Series]] = {}
        # Observed once a certificate, on the loop (a local mint's callback, a remote CA's
        # call): a rollout's burst observes it thousands of times a second.
        self.ca_latency = LoopHistogram(
            "pilot_sds_ca_request_duration_seconds",
            "Time for the CA to sign a workload CSR.",
            _SECONDS,
        )
        for histogram in (self.push_time, self.convergence, self.config_size, self.ca_latency):
            self.registry.register(histogram)
        self.localities_refused = Counter(
            "pilot_locality_refused",
            "Streams served no locality variant of their own, by budget: proven"
            " (PILOT_MAX_LOCALITIES) or unverified (PILOT_MAX_UNVERIFIED_LOCALITIES).",
            ["budget"],
            registry=self.registry,
        )
        self.registry_file_rejected = Counter(
            "pilot_registry_file_rejected",
            "Versions of the registry file (--config) not applied, by reason: unreadable,"
            " empty (a truncated write) or invalid.",
            ["reason"],
            registry=self.registry,
        )

        self.http_wrong_protocol = Counter(
            "pilot_http_wrong_protocol",
            "Connections to the HTTP port (--http-addr, --debug-addr) that spoke TLS or"
            " HTTP/2, by protocol: clients meant for an xDS port, most likely.",
            ["protocol"],
            registry=self.registry,
        )
        for protocol in ("tls", "http2"):  # both series from the start, at 0
            self.http_wrong_protocol.labels(protocol)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # -- what the pipeline and the streams report ----------------------------------

    def debounced(self, seconds: float) -> None:
        self.debounce.observe(seconds)

    def written(self, type_url: str, size: int, seconds: float) -> None:
        push_time, config_size = self._per_type.get(type_url) or self._labelled(type_url)
        push_time.observe(seconds)
        config_size.observe(size)

    def _labelled(self, type_url: str) -> tuple[Series, Series]:
        """A type's series, looked up once by its type URL: every response written
        reports here."""
        short = types.short_name(type_url)
        pair = (self.push_time.series(short), self.config_size.series(short))
        self._per_type[type_url] = pair
        return pair

    def converged(self, seconds: float) -> None:
        self.convergence.observe(seconds)

    def locality_refused(self, proven: bool) -> None:
        self.localities_refused.labels("proven" if proven else "unverified").inc()

    def http_wrong_protocol_for(self, protocol: str) -> None:
        """A TLS or HTTP/2 client came to the HTTP port (`wrong_protocol` tells)."""
        self.http_wrong_protocol.labels(protocol).inc()

    def registry_file_rejected_for(self, reason: str) -> None:
        """A version of the registry file was not applied (the file source says why)."""
        self.registry_file_rejected.labels(reason).inc()
