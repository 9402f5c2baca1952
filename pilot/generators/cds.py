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
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2

from pilot.builders.cds import build_cluster, served_port_names
from pilot.builders.mtls import transport_socket_matches
from pilot.builders.outbound import fixed_clusters
from pilot.builders.settings import BuildSettings
from pilot.generators.per_service import PerServiceGenerator
from pilot.push.request import Changes, PushRequest
from pilot.registry.index import EndpointIndex, IndexChange
from pilot.registry.model import Service, ServiceKey
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
    ) -> None:
        super().__init__(index, cache, settings, stats)
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
        names = served_port_names(service, self._settings.cluster_domain)
        stale = self._retrack(key, names.keys())
        changed: set[str] = set()
        for flavor in Flavor:
            built, sidecars = [], []
            if service is not None:
                for name, i in names.items():
                    cluster = build_cluster(
                        name, service.ports[i], flavor, self._settings.xds_cluster_name
                    )
                    built.append(Resource.from_message(types.CLUSTER, name, cluster))
                    if flavor is Flavor.ADS:
                        self._with_mtls(cluster, service, i)
                        sidecars.append(Resource.from_message(types.CLUSTER, name, cluster))
            self._stats.serializations[types.CLUSTER] += len(built) + len(sidecars)
            changed |= self._cache.update(types.CLUSTER, built, stale, flavor=flavor.value)
            if flavor is Flavor.ADS:
                changed |= self._cache.update(
                    types.CLUSTER, sidecars, stale, flavor=ADS_WITH_LISTENERS
                )
        return changed

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
