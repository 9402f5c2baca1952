"""What crosses the build step: a push request in, the changed names out.

A `PushRequest` is what changed since the last push, as one mergeable value:
registry changes say which services need clusters rebuilt (full), which only
their endpoints, and which IPs' pods changed their labels (workloads);
certificate changes name the proxies whose workload certificate was minted or
rotated; policy changes name the namespaces whose PeerAuthentications changed
(the root namespace: the mesh's); route changes name the services whose
VirtualServices changed (their route configurations alone are rebuilt).
Merging two requests is their union, so any number of changes waiting for a push
stay one bounded value; `PendingPush` collects them in place, so that adding one
costs its own size, not the size of what is already waiting (10,000 changes in a burst stay linear).

`Changes` is what a generator's build really changed in the cache: shared
names per type, and names per type owned by one proxy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pilot.registry.index import NO_CHANGE, IndexChange
from pilot.registry.model import ServiceKey
from pilot.xds.proxy import ProxyKey


@dataclass(frozen=True, slots=True)
class PushRequest:
    """Changed services (full or endpoints only) and proxies with a new certificate."""

    registry: IndexChange = NO_CHANGE
    certificates: frozenset[ProxyKey] = frozenset()
    mtls_namespaces: frozenset[str] = frozenset()
    routes: frozenset[ServiceKey] = frozenset()  # services whose VirtualServices moved

    def __bool__(self) -> bool:
        return bool(self.registry or self.certificates or self.mtls_namespaces or self.routes)

    def merge(self, other: PushRequest) -> PushRequest:
        if not other:
            return self
        if not self:
            return other
        return PushRequest(
            self.registry.merge(other.registry),
            self.certificates | other.certificates,
            self.mtls_namespaces | other.mtls_namespaces,
            self.routes | other.routes,
        )


NO_PUSH = PushRequest()


class PendingPush:
    """Push requests waiting to go, merged in place."""

    def __init__(self) -> None:
        self._full: set[ServiceKey] = set()
        self._endpoints: set[ServiceKey] = set()
        self._workloads: set[str] = set()
        self._certificates: set[ProxyKey] = set()
        self._mtls_namespaces: set[str] = set()
        self._routes: set[ServiceKey] = set()

    def __bool__(self) -> bool:
        return bool(
            self._full
            or self._endpoints
            or self._workloads
            or self._certificates
            or self._mtls_namespaces
            or self._routes
        )

    def add(self, request: PushRequest) -> None:
        self._full |= request.registry.full
        self._endpoints |= request.registry.endpoints
        self._workloads |= request.registry.workloads
        self._certificates |= request.certificates
        self._mtls_namespaces |= request.mtls_namespaces
        self._routes |= request.routes

    def take(self) -> PushRequest:
        """Everything waiting, as one request; nothing is left waiting."""
        if not self:
            return NO_PUSH
        registry = IndexChange(
            frozenset(self._full), frozenset(self._endpoints), frozenset(self._workloads)
        )
        request = PushRequest(
            registry,
            frozenset(self._certificates),
            frozenset(self._mtls_namespaces),
            frozenset(self._routes),
        )
        self._full, self._endpoints, self._certificates = set(), set(), set()
        self._workloads = set()
        self._mtls_namespaces = set()
        self._routes = set()
        return request


@dataclass
class Changes:
    """Names whose cached resource changed: shared ones, and each proxy's own."""

    shared: dict[str, set[str]] = field(default_factory=dict)
    owned: dict[ProxyKey, dict[str, set[str]]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.shared or self.owned)

    def add(self, other: Changes) -> None:
        for type_url, names in other.shared.items():
            self.shared.setdefault(type_url, set()).update(names)
        for proxy, by_type in other.owned.items():
            mine = self.owned.setdefault(proxy, {})
            for type_url, names in by_type.items():
                mine.setdefault(type_url, set()).update(names)


@dataclass(frozen=True, slots=True)
class RequestSink:
    """The registry's changes as push requests (`pilot.registry.updater.ChangeSink`)."""

    submit: Callable[[PushRequest], None]

    def registry_changed(self, change: IndexChange) -> None:
        self.submit(PushRequest(registry=change))

    def policies_changed(self, namespaces: frozenset[str]) -> None:
        self.submit(PushRequest(mtls_namespaces=namespaces))

    def routes_changed(self, services: frozenset[ServiceKey]) -> None:
        self.submit(PushRequest(routes=services))
