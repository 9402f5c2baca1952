"""CDS and EDS: keeps the cache in step with the endpoint index, rebuilding only what changed.

A full change rebuilds the clusters (every flavor) and assignments of the
services named; an endpoint change rebuilds only their assignments. Each new
resource is serialized exactly once here; the cache then says which names
really changed, and that is what gets pushed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pilot.generators.cds import build_cluster, served_ports
from pilot.generators.eds import encode_load_assignment
from pilot.generators.naming import outbound_cluster_name
from pilot.push.request import Changes, PushRequest
from pilot.registry.index import EndpointIndex, IndexChange
from pilot.registry.model import Service, ServiceKey
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import Flavor
from pilot.xds.resource import Resource

TypeChanges = dict[str, set[str]]


@dataclass(frozen=True, slots=True)
class BuildSettings:
    """What resource content depends on besides the registry."""

    cluster_domain: str = "cluster.local"
    xds_cluster_name: str = "xds-grpc"


class ResourceBuilder:
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

    def build(self, request: PushRequest) -> Changes:
        """Rebuild what the request's registry change touches."""
        return Changes(shared=self.apply(request.registry)) if request.registry else Changes()

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
            built = []
            if service is not None:
                for name, i in names.items():
                    cluster = build_cluster(
                        name, service.ports[i], flavor, self._settings.xds_cluster_name
                    )
                    built.append(Resource.from_message(types.CLUSTER, name, cluster))
            self._stats.serializations[types.CLUSTER] += len(built)
            changed |= self._cache.update(types.CLUSTER, built, stale, flavor=flavor.value)
        return changed

    def _rebuild_assignments(self, key: ServiceKey) -> set[str]:
        service = self._index.services.get(key)
        names = self._port_names(service)
        stale = _retrack(self._assignment_names, key, names.keys())
        built = []
        if service is not None:
            endpoint_sets = self._index.endpoint_sets(key)
            for name, i in names.items():
                assignment = encode_load_assignment(name, service.ports[i], endpoint_sets)
                built.append(Resource.from_payload(types.ENDPOINT, name, assignment))
        self._stats.serializations[types.ENDPOINT] += len(built)
        return self._cache.update(types.ENDPOINT, built, stale)


def _retrack(
    tracked: dict[ServiceKey, set[str]], key: ServiceKey, names: Iterable[str]
) -> set[str]:
    """Record a service's current resource names; returns the ones it no longer has."""
    current = set(names)
    stale = tracked.pop(key, set()) - current
    if current:
        tracked[key] = current
    return stale
