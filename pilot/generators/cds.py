"""CDS: keeps the clusters in step with the endpoint index, rebuilding only what changed.

A full change of a service rebuilds its clusters (every flavor); an endpoint change
builds nothing here. Each new cluster is serialized exactly once; the cache then says
which names really changed, and that is what gets pushed.

ADS streams that read listeners (sidecars) read their clusters from one more table
(`ADS_WITH_LISTENERS`): the ADS clusters with auto mTLS's transport socket matches
(`pilot.builders.mtls`: the SANs are the service's pods' service accounts, so a
change of those is a full change of the service), plus PassthroughCluster and
BlackHoleCluster, which outbound listeners name. A proxy that reads no listener
never holds those, and its clusters are as before.

A service's DestinationRule (`TrafficConfig.rule_for`) adds a cluster per subset and
port (`outbound|PORT|SUBSET|HOST`) and shapes each cluster by the policy it gets
(`pilot.builders.traffic_policy`); its `tls` replaces auto mTLS on the sidecars'
clusters. A rule's change is a full change of the services it names: their clusters
are rebuilt, and only those whose bytes moved are sent.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2

from pilot.builders.cds import build_cluster, cluster_names
from pilot.builders.mtls import transport_socket_matches, upstream_tls
from pilot.builders.outbound import fixed_clusters
from pilot.builders.settings import BuildSettings
from pilot.builders.traffic_policy import (
    apply_policy,
    fail_closed,
    set_transport_socket,
    simple_tls,
)
from pilot.generators.per_service import PerServiceGenerator
from pilot.push.request import Changes, PushRequest
from pilot.registry.destination_rule import ClientTls, DestinationRule, PortPolicy, policy_for
from pilot.registry.index import EndpointIndex, IndexChange
from pilot.registry.model import Service, ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import ADS_WITH_LISTENERS, Flavor
from pilot.xds.resource import Resource


class ClusterGenerator(PerServiceGenerator):
    """The CDS generator: services' full changes in, cluster updates out."""

    type_urls = frozenset({types.CLUSTER})

    def __init__(
        self,
        index: EndpointIndex,
        cache: ResourceCache,
        settings: BuildSettings,
        stats: XdsStats,
        traffic: TrafficConfig | None = None,
    ) -> None:
        super().__init__(index, cache, settings, stats, traffic)
        self._fixed_built = False

    def build(self, request: PushRequest) -> Changes:
        """Rebuild the clusters of the services the request changes in full."""
        changed = self.apply(request.registry) if request.registry else set()
        if not self._fixed_built:
            self._fixed_built = True
            changed |= self._build_fixed_clusters()
        return Changes(shared={types.CLUSTER: changed}) if changed else Changes()

    def apply(self, change: IndexChange) -> set[str]:
        """Rebuild the clusters `change` touches; returns the names that changed."""
        changed: set[str] = set()
        for key in sorted(change.full):
            changed |= self._rebuild(key)
        return changed

    def _build_fixed_clusters(self) -> set[str]:
        """PassthroughCluster and BlackHoleCluster, for the streams that read listeners."""
        built = [Resource.from_message(types.CLUSTER, c.name, c) for c in fixed_clusters()]
        self._stats.serializations[types.CLUSTER] += len(built)
        return self._cache.update(types.CLUSTER, built, flavor=ADS_WITH_LISTENERS)

    def _rebuild(self, key: ServiceKey) -> set[str]:
        service = self._index.services.get(key)
        rule = self._traffic.rule_for(key) if service is not None else None
        subsets = [s.name for s in rule.subsets] if rule is not None else []
        names = cluster_names(service, subsets, self._settings.cluster_domain)
        stale = self._retrack(key, names.keys())
        changed: set[str] = set()
        for flavor in Flavor:
            built, sidecars = [], []
            if service is not None:
                for name, (i, subset) in names.items():
                    cluster, policy = self._cluster(name, service, i, subset, rule, flavor=flavor)
                    built.append(Resource.from_message(types.CLUSTER, name, cluster))
                    if flavor is Flavor.ADS:
                        self._with_tls(cluster, service, i, rule, policy)
                        sidecars.append(Resource.from_message(types.CLUSTER, name, cluster))
            self._stats.serializations[types.CLUSTER] += len(built) + len(sidecars)
            changed |= self._cache.update(types.CLUSTER, built, stale, flavor=flavor.value)
            if flavor is Flavor.ADS:
                changed |= self._cache.update(
                    types.CLUSTER, sidecars, stale, flavor=ADS_WITH_LISTENERS
                )
        return changed

    def _cluster(
        self,
        name: str,
        service: Service,
        i: int,
        subset: str,
        rule: DestinationRule | None,
        *,
        flavor: Flavor,
    ) -> tuple[cluster_pb2.Cluster, PortPolicy]:
        """Cluster `name` of port `i` (of `subset`) in `flavor`, shaped by `rule`."""
        cluster = build_cluster(name, service.ports[i], flavor, self._settings.xds_cluster_name)
        policy = policy_for(rule, service.ports[i].port, subset)
        apply_policy(cluster, policy)
        return cluster, policy

    def sidecar_clusters(self, key: ServiceKey, rule: DestinationRule | None) -> list[Resource]:
        """The sidecars' clusters of `key` shaped by `rule` (for the sidecars of a namespace
        that follow another rule than the shared one: `pilot.generators.client_clusters`)."""
        service = self._index.services.get(key)
        if service is None:
            return []
        subsets = [s.name for s in rule.subsets] if rule is not None else []
        built = []
        for name, (i, subset) in cluster_names(
            service, subsets, self._settings.cluster_domain
        ).items():
            cluster, policy = self._cluster(name, service, i, subset, rule, flavor=Flavor.ADS)
            self._with_tls(cluster, service, i, rule, policy)
            built.append(Resource.from_message(types.CLUSTER, name, cluster))
        self._stats.serializations[types.CLUSTER] += len(built)
        return built

    def _with_tls(
        self,
        cluster: cluster_pb2.Cluster,
        service: Service,
        i: int,
        rule: DestinationRule | None,
        policy: PortPolicy,
    ) -> None:
        """A sidecar's cluster of `cluster`: auto mTLS, unless the rule's tls says else."""
        tls = policy.tls
        if tls is None:
            self._with_mtls(cluster, service, i)
        elif tls.unsupported:
            fail_closed(cluster)
        elif tls.mode == "SIMPLE":
            set_transport_socket(cluster, simple_tls(tls))
        elif tls.mode == "ISTIO_MUTUAL":
            set_transport_socket(cluster, self._istio_mutual(cluster.name, service, i, tls))
        # DISABLE: plaintext, to every endpoint

    def _istio_mutual(
        self, name: str, service: Service, i: int, tls: ClientTls
    ) -> tls_pb2.UpstreamTlsContext:
        """Istio's mTLS to every endpoint, the rule's subjectAltNames where given; its sni,
        else (as istiod) the cluster's name."""
        context = upstream_tls(
            service.key,
            service.ports[i],
            self._index.service_accounts(service.key),
            cluster_domain=self._settings.cluster_domain,
            trust_domain=self._settings.trust_domain,
        )
        context.sni = tls.sni or name
        if tls.subject_alt_names:
            sans = context.common_tls_context.combined_validation_context.default_validation_context
            del sans.match_typed_subject_alt_names[:]
            for san in tls.subject_alt_names:
                sans.match_typed_subject_alt_names.add(
                    san_type=common_pb2.SubjectAltNameMatcher.URI,
                    matcher=string_pb2.StringMatcher(exact=san),
                )
        return context

    def _with_mtls(self, cluster: cluster_pb2.Cluster, service: Service, i: int) -> None:
        """Make a sidecar's cluster of `cluster`: auto mTLS to endpoints with sidecars."""
        cluster.transport_socket_matches.extend(
            transport_socket_matches(
                service.key,
                service.ports[i],
                self._index.service_accounts(service.key),
                cluster_domain=self._settings.cluster_domain,
                trust_domain=self._settings.trust_domain,
            )
        )
