"""The CDS and EDS generators side by side, as the pipeline runs them on one registry
change: what each rebuilt, by type (a type that changed nothing is left out)."""

from __future__ import annotations

from pilot.builders.settings import BuildSettings
from pilot.generators.cds import ClusterGenerator
from pilot.generators.eds import EndpointGenerator
from pilot.registry.index import EndpointIndex, IndexChange
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache


class ClustersAndEndpoints:
    """Both generators on one index and cache."""

    def __init__(
        self, index: EndpointIndex, cache: ResourceCache, settings: BuildSettings, stats: XdsStats
    ) -> None:
        self.clusters = ClusterGenerator(index, cache, settings, stats)
        self.endpoints = EndpointGenerator(index, cache, settings, stats)

    def apply(self, change: IndexChange) -> dict[str, set[str]]:
        changed = {
            types.CLUSTER: self.clusters.apply(change),
            types.ENDPOINT: self.endpoints.apply(change),
        }
        return {type_url: names for type_url, names in changed.items() if names}
