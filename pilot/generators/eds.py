"""EDS: keeps the assignments in step with the endpoint index, rebuilding only what changed.

A full or an endpoint change of a service rebuilds its assignments, nothing else:
the fast path. Each new assignment is encoded exactly once per variant; the cache
then says which names really changed, and that is what gets pushed.

Assignments come in variants, one per proxy locality in use (`add_locality`,
`drop_locality`, driven by the pipeline as proxies come and go) besides the shared
one for proxies without a locality: a service's endpoints are grouped once, then
encoded once per (proxy locality, what the cluster's locality rule asks,
`pilot.builders.locality_lb`): a cluster whose rule ignores the proxy's locality
(the default: no DestinationRule, or one without outlier detection or
`distribute`) is encoded once and the same bytes go into every variant's cache
flavor. Assignments mark the endpoints whose pod runs a sidecar (the index knows).

A subset of the service's DestinationRule has an assignment of its own per port
(`outbound|PORT|SUBSET|HOST`): the endpoints whose pod (found as auto mTLS finds it,
by its targetRef) has every label of the subset; an endpoint whose pod is not known
is in no subset.
"""

from __future__ import annotations

from collections.abc import Iterable

from pilot.builders.cds import cluster_names
from pilot.builders.eds import LocalityGroups, encode_groups, group_hosts
from pilot.builders.locality_lb import LocalityRule, locality_rule
from pilot.builders.settings import BuildSettings
from pilot.generators.per_service import PerServiceGenerator
from pilot.push.request import Changes, PushRequest
from pilot.registry.destination_rule import DestinationRule, Subset, policy_for
from pilot.registry.index import EndpointIndex, IndexChange
from pilot.registry.model import Endpoint, EndpointGroup, EndpointSet, Service, ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import SHARED, ResourceCache
from pilot.xds.locality import NOWHERE, Locality
from pilot.xds.resource import Resource


class EndpointGenerator(PerServiceGenerator):
    """The EDS generator: services' endpoint (and full) changes in, assignment updates out."""

    type_urls = frozenset({types.ENDPOINT})

    def __init__(
        self,
        index: EndpointIndex,
        cache: ResourceCache,
        settings: BuildSettings,
        stats: XdsStats,
        traffic: TrafficConfig | None = None,
    ) -> None:
        super().__init__(index, cache, settings, stats, traffic)
        self._variants: dict[str, Locality] = {SHARED: NOWHERE}  # flavor -> proxy locality

    def build(self, request: PushRequest) -> Changes:
        """Rebuild the assignments of the services the request changes."""
        changed = self.apply(request.registry) if request.registry else set()
        return Changes(shared={types.ENDPOINT: changed}) if changed else Changes()

    def apply(self, change: IndexChange) -> set[str]:
        """Rebuild the assignments `change` touches; returns the names that changed."""
        changed: set[str] = set()
        for key in sorted(change.full | change.endpoints):
            changed |= self._rebuild(key)
        return changed

    def add_locality(self, locality: Locality) -> None:
        """Build every assignment for proxies in `locality` (the first of them arrived)."""
        if locality.flavor in self._variants:
            return
        self._variants[locality.flavor] = locality
        for key in sorted(self._names):
            self._rebuild(key, {locality.flavor: locality})

    def drop_locality(self, locality: Locality) -> None:
        """The last proxy in `locality` left: its variant is no longer kept."""
        if locality.flavor != SHARED and self._variants.pop(locality.flavor, None) is not None:
            self._cache.drop_flavor(types.ENDPOINT, locality.flavor)

    def _rebuild(self, key: ServiceKey, variants: dict[str, Locality] | None = None) -> set[str]:
        service = self._index.services.get(key)
        rule = self._traffic.rule_for(key) if service is not None else None
        names = self._cluster_names(service, rule)
        stale = self._retrack(key, names.keys()) if variants is None else set()
        built = self._assignments(
            service, rule, names, variants or self._variants, reuse=bool(variants)
        )
        changed: set[str] = set()
        for flavor, resources in built.items():
            changed |= self._cache.update(types.ENDPOINT, resources, stale, flavor=flavor)
        return changed

    def assignments(
        self, key: ServiceKey, rule: DestinationRule | None, locality: Locality
    ) -> list[Resource]:
        """The assignments of `key`'s clusters shaped by `rule`, for proxies in `locality`
        (for the sidecars of a namespace that follow another rule than the shared one:
        `pilot.generators.client_clusters`)."""
        service = self._index.services.get(key)
        names = self._cluster_names(service, rule)
        return self._assignments(service, rule, names, {SHARED: locality}, reuse=False)[SHARED]

    def _cluster_names(
        self, service: Service | None, rule: DestinationRule | None
    ) -> dict[str, tuple[int, str]]:
        subsets = [s.name for s in rule.subsets] if rule is not None else []
        return cluster_names(service, subsets, self._settings.cluster_domain)

    def _assignments(
        self,
        service: Service | None,
        rule: DestinationRule | None,
        names: dict[str, tuple[int, str]],
        variants: dict[str, Locality],
        *,
        reuse: bool,
    ) -> dict[str, list[Resource]]:
        """Per variant, the assignments of clusters `names` of `service`, shaped by `rule`;
        `reuse`: a cluster whose rule ignores the proxy's locality takes the shared bytes
        (built under the same rule)."""
        subsets = {s.name: s for s in rule.subsets} if rule is not None else {}
        built: dict[str, list[Resource]] = {flavor: [] for flavor in variants}
        if service is not None:
            endpoint_sets = self._index.endpoint_sets(service.key)
            members: dict[str, list[EndpointSet]] | None = None
            for name, (i, subset) in names.items():
                port = service.ports[i]
                locality_lb = locality_rule(policy_for(rule, port.port, subset))
                shared = self._cache.get(types.ENDPOINT, name) if reuse else None
                if shared is not None and not locality_lb.by_locality:
                    for resources in built.values():  # a new locality reads the shared bytes
                        resources.append(shared)
                    continue
                if subset and members is None:
                    members = self._members(endpoint_sets, subsets.values())
                groups = group_hosts(
                    port,
                    members[subset] if subset and members is not None else endpoint_sets,
                    self._index.locality_of,
                    self._index.runs_sidecar,
                )
                self._encode(name, groups, locality_lb, variants, built)
        return built

    def _encode(
        self,
        name: str,
        groups: LocalityGroups,
        locality_lb: LocalityRule,
        variants: dict[str, Locality],
        built: dict[str, list[Resource]],
    ) -> None:
        """One cluster's assignment into each variant: encoded once per distinct answer
        (once in all where its rule ignores the proxy's locality)."""
        encoded: dict[Locality, Resource] = {}
        for flavor, locality in variants.items():
            asked = locality if locality_lb.by_locality else NOWHERE
            if asked not in encoded:
                assignment = encode_groups(name, groups, asked, locality_lb)
                encoded[asked] = Resource.from_payload(types.ENDPOINT, name, assignment)
                self._stats.serializations[types.ENDPOINT] += 1
            built[flavor].append(encoded[asked])

    def _members(
        self, endpoint_sets: list[EndpointSet], subsets: Iterable[Subset]
    ) -> dict[str, list[EndpointSet]]:
        """Per subset, the endpoint sets with only the endpoints whose pod it selects (each
        endpoint's pod looked up once, however many subsets there are)."""
        labels = {
            (endpoint_set.key, endpoint): self._labels(endpoint_set, endpoint)
            for endpoint_set in endpoint_sets
            for group in endpoint_set.groups
            for endpoint in group.endpoints
        }

        def kept(endpoint_set: EndpointSet, subset: Subset) -> EndpointSet:
            groups = []
            for group in endpoint_set.groups:
                chosen = tuple(
                    e
                    for e in group.endpoints
                    if (found := labels[(endpoint_set.key, e)]) is not None
                    and subset.selects(found)
                )
                if chosen:
                    groups.append(EndpointGroup(group.ports, chosen))
            return EndpointSet(endpoint_set.key, endpoint_set.service, tuple(groups))

        return {s.name: [kept(es, s) for es in endpoint_sets] for s in subsets}

    def _labels(self, endpoint_set: EndpointSet, endpoint: Endpoint) -> dict[str, str] | None:
        """The labels of the endpoint's pod (None: no pod known, or its labels not kept)."""
        if not endpoint.addresses:
            return None
        pod = self._index.pod_for(endpoint_set.key, endpoint.addresses[0], endpoint.pod_name)
        return dict(pod.labels) if pod is not None and pod.labels is not None else None
