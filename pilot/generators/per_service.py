"""What the CDS and EDS generators share: a resource per served port of each service, so
each keeps the names every service has now, and drops the ones it no longer has."""

from __future__ import annotations

from collections.abc import Iterable

from pilot.builders.settings import BuildSettings
from pilot.registry.index import EndpointIndex
from pilot.registry.model import ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.stats import XdsStats
from pilot.xds.cache import ResourceCache


class PerServiceGenerator:
    """A generator whose resources are named by its services' ports."""

    def __init__(
        self,
        index: EndpointIndex,
        cache: ResourceCache,
        settings: BuildSettings,
        stats: XdsStats,
        traffic: TrafficConfig | None = None,
    ) -> None:
        self._index = index
        self._traffic = traffic if traffic is not None else TrafficConfig(settings.cluster_domain)
        self._cache = cache
        self._settings = settings
        self._stats = stats
        self._names: dict[ServiceKey, set[str]] = {}

    def shared_names(self, key: ServiceKey) -> set[str]:
        """The names of the shared resources of `key`."""
        return set(self._names.get(key, ()))

    def _retrack(self, key: ServiceKey, names: Iterable[str]) -> set[str]:
        """Record a service's current resource names; returns the ones it no longer has."""
        current = set(names)
        stale = self._names.pop(key, set()) - current
        if current:
            self._names[key] = current
        return stale
