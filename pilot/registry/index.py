"""The endpoint index: services and their endpoint sets, and what each update means.

Every update returns an `IndexChange` saying which services need a *full* push
(clusters changed: a service appeared, went away, or changed its ports) and
which need only an *endpoint* push (their ClusterLoadAssignments changed).
Content-equal updates change nothing. A service dropping to zero endpoints is
an endpoint change, never a full one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pilot.registry.model import EndpointSet, EndpointSetKey, Service, ServiceKey


@dataclass(frozen=True, slots=True)
class IndexChange:
    """Which services need clusters rebuilt (full) and which only endpoints."""

    full: frozenset[ServiceKey] = frozenset()
    endpoints: frozenset[ServiceKey] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.full or self.endpoints)

    def merge(self, other: IndexChange) -> IndexChange:
        return IndexChange(self.full | other.full, self.endpoints | other.endpoints)

    @staticmethod
    def union(changes: Iterable[IndexChange]) -> IndexChange:
        """All of them as one (in one pass: merging them pairwise copies quadratically)."""
        full: set[ServiceKey] = set()
        endpoints: set[ServiceKey] = set()
        for change in changes:
            full |= change.full
            endpoints |= change.endpoints
        return IndexChange(frozenset(full), frozenset(endpoints))


NO_CHANGE = IndexChange()


@dataclass
class EndpointIndex:
    """service -> endpoint sets, plus the services themselves."""

    services: dict[ServiceKey, Service] = field(default_factory=dict)
    _sets: dict[EndpointSetKey, EndpointSet] = field(default_factory=dict)
    _by_service: dict[ServiceKey, set[EndpointSetKey]] = field(default_factory=dict)

    def endpoint_sets(self, service: ServiceKey) -> list[EndpointSet]:
        """The sets that feed a service's endpoints: slices if it has any, else legacy."""
        sets = [self._sets[k] for k in sorted(self._by_service.get(service, ()))]
        modern = [s for s in sets if not s.legacy]
        return modern or sets

    def upsert_service(self, service: Service) -> IndexChange:
        old = self.services.get(service.key)
        if old == service:
            return NO_CHANGE
        self.services[service.key] = service
        return IndexChange(full=frozenset({service.key}))

    def delete_service(self, key: ServiceKey) -> IndexChange:
        if self.services.pop(key, None) is None:
            return NO_CHANGE
        return IndexChange(full=frozenset({key}))

    def upsert_endpoints(self, endpoint_set: EndpointSet) -> IndexChange:
        old = self._sets.get(endpoint_set.key)
        if old == endpoint_set:
            return NO_CHANGE
        change = self.delete_endpoints(endpoint_set.key) if old else NO_CHANGE
        self._sets[endpoint_set.key] = endpoint_set
        self._by_service.setdefault(endpoint_set.service, set()).add(endpoint_set.key)
        return change.merge(self._endpoint_change(endpoint_set.service))

    def delete_endpoints(self, key: EndpointSetKey) -> IndexChange:
        old = self._sets.pop(key, None)
        if old is None:
            return NO_CHANGE
        owned = self._by_service.get(old.service)
        if owned is not None:
            owned.discard(key)
            if not owned:
                del self._by_service[old.service]
        return self._endpoint_change(old.service)

    def replace_all(
        self, services: Iterable[Service], endpoint_sets: Iterable[EndpointSet]
    ) -> IndexChange:
        """Make the index equal to a full state (a file reload or a relist): apply the diff."""
        wanted_services = {s.key: s for s in services}
        wanted_sets = {s.key: s for s in endpoint_sets}
        changes = [self.delete_endpoints(k) for k in set(self._sets) - set(wanted_sets)]
        changes += [self.delete_service(k) for k in set(self.services) - set(wanted_services)]
        changes += [self.upsert_service(service) for service in wanted_services.values()]
        changes += [self.upsert_endpoints(s) for s in wanted_sets.values()]
        return IndexChange.union(changes)

    def _endpoint_change(self, service: ServiceKey) -> IndexChange:
        if service not in self.services:
            return NO_CHANGE  # endpoints of an unknown service matter once it appears
        return IndexChange(endpoints=frozenset({service}))
