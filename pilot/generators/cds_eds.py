"""CDS and EDS: keeps the cache in step with the endpoint index, rebuilding only what changed.

A full change rebuilds the clusters (every flavor) and assignments of the
services named; an endpoint change rebuilds only their assignments. Each new
resource is serialized exactly once here; the cache then says which names
really changed, and that is what gets pushed.

Assignments come in variants, one per proxy locality in use (`add_locality`,
`drop_locality`, driven by the pipeline as proxies come and go) besides the
shared one for proxies without a locality: a service's endpoints are grouped
once, then encoded once per variant, into that variant's cache flavor.

ADS streams that read listeners (sidecars) read their clusters from one more
table (`ADS_WITH_LISTENERS`): the ADS clusters with auto mTLS's transport
socket matches (`pilot.builders.mtls`: the SANs are the service's pods'
service accounts, so a change of those is a full change of the service), plus
PassthroughCluster and BlackHoleCluster, which outbound listeners name. A proxy
that reads no listener never holds those, and its clusters are as before.
Assignments mark the endpoints whose pod runs a sidecar (the index knows).
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy.config.cluster.v3 import cluster_pb2

from pilot.builders.cds import build_cluster, served_ports
from pilot.builders.eds import encode_groups, group_hosts
from pilot.builders.mtls import transport_socket_matches
from pilot.builders.naming import outbound_cluster_name
from pilot.builders.outbound import fixed_clusters
from pilot.builders.settings import BuildSettings
from pilot.push.request import Changes, PushRequest
from pilot.registry.index import EndpointIndex, IndexChange
from pilot.registry.model import Service, ServiceKey
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import SHARED, ResourceCache
from pilot.xds.flavor import ADS_WITH_LISTENERS, Flavor
from pilot.xds.locality import NOWHERE, Locality
from pilot.xds.resource import Resource

TypeChanges = dict[str, set[str]]


class ClusterEndpointGenerator:
    """The CDS and EDS generator: index changes in, cache updates out."""

    type_urls = frozenset({types.CLUSTER, types.ENDPOINT})

    def __init__(
        self,
        index: EndpointIndex,
        cache: ResourceCache,
        settings: BuildSettings,
        stats: XdsStats,
    ) -> None:
        self._index = index
        self._cache = cache
        self._settings = settings
        self._stats = stats
        self._cluster_names: dict[ServiceKey, set[str]] = {}
        self._assignment_names: dict[ServiceKey, set[str]] = {}
        self._variants: dict[str, Locality] = {SHARED: NOWHERE}  # flavor -> proxy locality
        self._fixed_built = False

    def build(self, request: PushRequest) -> Changes:
        """Rebuild what the request's registry change touches."""
        changed = self.apply(request.registry) if request.registry else {}
        if not self._fixed_built:
            self._fixed_built = True
            changed.setdefault(types.CLUSTER, set()).update(self._build_fixed_clusters())
        return Changes(shared=changed) if changed else Changes()

    def _build_fixed_clusters(self) -> set[str]:
        """PassthroughCluster and BlackHoleCluster, for the streams that read listeners."""
        built = [Resource.from_message(types.CLUSTER, c.name, c) for c in fixed_clusters()]
        self._stats.serializations[types.CLUSTER] += len(built)
        return self._cache.update(types.CLUSTER, built, flavor=ADS_WITH_LISTENERS)

    def apply(self, change: IndexChange) -> TypeChanges:
        """Rebuild what `change` touches; returns {type_url: names that changed}."""
        changed: TypeChanges = {}
        for key in sorted(change.full):
            changed.setdefault(types.CLUSTER, set()).update(self._rebuild_clusters(key))
        for key in sorted(change.full | change.endpoints):
            changed.setdefault(types.ENDPOINT, set()).update(self._rebuild_assignments(key))
        return {type_url: names for type_url, names in changed.items() if names}

    def _port_names(self, service: Service | None) -> dict[str, int]:
        if service is None:
            return {}
        domain = self._settings.cluster_domain
        return {
            outbound_cluster_name(service.key, port, domain): i
            for i, port in enumerate(service.ports)
            if port in served_ports(service)
        }

    def _rebuild_clusters(self, key: ServiceKey) -> set[str]:
        service = self._index.services.get(key)
        names = self._port_names(service)
        stale = _retrack(self._cluster_names, key, names.keys())
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

    def add_locality(self, locality: Locality) -> None:
        """Build every assignment for proxies in `locality` (the first of them arrived)."""
        if locality.flavor in self._variants:
            return
        self._variants[locality.flavor] = locality
        for key in sorted(self._assignment_names):
            self._rebuild_assignments(key, {locality.flavor: locality})

    def drop_locality(self, locality: Locality) -> None:
        """The last proxy in `locality` left: its variant is no longer kept."""
        if locality.flavor != SHARED and self._variants.pop(locality.flavor, None) is not None:
            self._cache.drop_flavor(types.ENDPOINT, locality.flavor)

    def _rebuild_assignments(
        self, key: ServiceKey, variants: dict[str, Locality] | None = None
    ) -> set[str]:
        service = self._index.services.get(key)
        names = self._port_names(service)
        stale = _retrack(self._assignment_names, key, names.keys()) if variants is None else set()
        built: dict[str, list[Resource]] = {flavor: [] for flavor in variants or self._variants}
        if service is not None:
            endpoint_sets = self._index.endpoint_sets(key)
            for name, i in names.items():
                groups = group_hosts(
                    service.ports[i],
                    endpoint_sets,
                    self._index.locality_of,
                    self._index.runs_sidecar,
                )
                for flavor, locality in (variants or self._variants).items():
                    assignment = encode_groups(name, groups, locality)
                    built[flavor].append(Resource.from_payload(types.ENDPOINT, name, assignment))
        changed: set[str] = set()
        for flavor, resources in built.items():
            self._stats.serializations[types.ENDPOINT] += len(resources)
            changed |= self._cache.update(types.ENDPOINT, resources, stale, flavor=flavor)
        return changed


def _retrack(
    tracked: dict[ServiceKey, set[str]], key: ServiceKey, names: Iterable[str]
) -> set[str]:
    """Record a service's current resource names; returns the ones it no longer has."""
    current = set(names)
    stale = tracked.pop(key, set()) - current
    if current:
        tracked[key] = current
    return stale
