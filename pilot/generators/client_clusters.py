"""Clusters of their own for the sidecars of a namespace that follows other DestinationRules.

The shared clusters follow, for each service, the rule every namespace sees
(`TrafficConfig.rule_for` with no client). A sidecar in namespace C may see other
rules, as Istio's sidecar scope does: one written in C (for any service, `exportTo`
`.`, `*` or naming C), one exported to C by name. For the services whose rule is
another for C (`TrafficConfig.differing`), C's sidecars read a *flavor*: those
services' clusters shaped by C's rule, their subsets' assignments, and the shared
names C's rule has not (another rule's subsets: hidden, `ResourceCache.hide`),
laid over the shared tables for their streams alone (`ResourceCache.set_overlay`,
layer `client`, on the streams that read sidecars' clusters). A table of clusters
is built once per namespace, one of assignments once per (namespace, proxy
locality), each shared by every sidecar there, and dropped with its last reader.

Who a sidecar is comes from what it proved: its namespace is its proven identity's.
A stream that proved none reads the shared clusters (a claimed namespace would read
another namespace's private rules). Bounded by the configuration: a namespace gets
tables only while a rule makes some service differ there and a proven sidecar of it
is connected, and assignments per locality only for the localities that have
variants (`PILOT_MAX_LOCALITIES`); the gauge `pilot_cluster_flavors` counts them.

What a change pushes: a service's full change rebuilds its clusters and assignments
in the tables that hold it (or should now), an endpoint change its assignments
only (the fast path, for the namespaces that differ on it), a change of the rules
recomputes which services differ where; each table's changes go to its readers
alone (`Changes.owned`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from pilot.generators.client_routes import proven
from pilot.push.request import Changes, PushRequest
from pilot.registry.destination_rule import DestinationRule
from pilot.registry.index import EndpointIndex
from pilot.registry.model import ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import ADS_WITH_LISTENERS
from pilot.xds.interception import Interception
from pilot.xds.locality import Locality
from pilot.xds.proxy import ProxyKey
from pilot.xds.resource import Resource

LAYER = "client"
K = TypeVar("K")
Owned = dict[ProxyKey, dict[str, set[str]]]


class ClusterSource(Protocol):
    """The CDS generator, as the flavors use it."""

    def sidecar_clusters(self, key: ServiceKey, rule: DestinationRule | None) -> list[Resource]: ...

    def shared_names(self, key: ServiceKey) -> set[str]: ...


class EndpointSource(Protocol):
    """The EDS generator, as the flavors use it."""

    def assignments(
        self, key: ServiceKey, rule: DestinationRule | None, locality: Locality
    ) -> list[Resource]: ...

    def shared_names(self, key: ServiceKey) -> set[str]: ...


@dataclass(frozen=True, slots=True)
class Builder:
    """How one type's resources of a service are built under a rule, and the flavor of the
    shared ones they are laid over."""

    shared_flavor: str
    build: Callable[[ServiceKey, DestinationRule | None], list[Resource]]


@dataclass(slots=True)
class _Table:
    """One flavor of one type: its cache table, what it holds per service, its readers."""

    flavor: str
    built: dict[ServiceKey, set[str]] = field(default_factory=dict)
    hidden: dict[ServiceKey, set[str]] = field(default_factory=dict)
    readers: set[ProxyKey] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class _Sidecar:
    namespace: str
    locality: Locality


class ClientClusters:
    """The cluster and assignment flavors of the namespaces that follow other rules."""

    type_urls = frozenset({types.CLUSTER, types.ENDPOINT})

    def __init__(
        self,
        index: EndpointIndex,
        cache: ResourceCache,
        traffic: TrafficConfig,
        sources: tuple[ClusterSource, EndpointSource],
        stats: XdsStats,
    ) -> None:
        self._index = index
        self._cache = cache
        self._traffic = traffic
        self._clusters, self._endpoints = sources
        self._stats = stats
        self._ids = itertools.count(1)
        self._sidecars: dict[ProxyKey, _Sidecar] = {}
        self._differ: dict[str, set[ServiceKey]] = {}  # namespace -> services it differs on
        self._generation = -1  # the rules' generation `_differ` was worked out for
        self._cds: dict[str, _Table] = {}
        self._eds: dict[tuple[str, Locality], _Table] = {}

    @property
    def flavors(self) -> int:
        """Cluster and assignment tables held."""
        return len(self._cds) + len(self._eds)

    # -- sidecars come and go ------------------------------------------------------

    def client_joined(
        self, proxy: ProxyKey, interception: Interception, locality: Locality
    ) -> None:
        """The first stream of `proxy` joined (in `locality`, or none if it got no variant):
        lay its namespace's flavor, if it has one (before it is answered)."""
        del interception  # clusters are one for every mode
        identity = proven(proxy)
        if identity is None:
            return
        # Read as of the last build (a rule changed since moves it at the next one).
        sidecar = self._sidecars[proxy] = _Sidecar(identity[0], locality)
        if self._differ.get(sidecar.namespace):
            self._read(proxy, sidecar)

    def client_left(self, proxy: ProxyKey) -> None:
        sidecar = self._sidecars.pop(proxy, None)
        if sidecar is not None:
            self._unread(proxy, sidecar)

    # -- what a build changes --------------------------------------------------------

    def build(self, request: PushRequest) -> Changes:
        """Rebuild, in the tables that hold them or should now, the clusters of the services
        changed in full and the assignments of those whose endpoints changed; lay or lift
        the flavors of namespaces that start or stop differing."""
        change = request.registry
        before = {ns: set(keys) for ns, keys in self._differ.items()}
        if change.full or self._generation != self._traffic.rules_generation:
            self._refresh(force=bool(change.full))
        owned: Owned = {}
        for namespace in sorted(before.keys() | self._differ.keys()):
            was, now = before.get(namespace, set()), self._differ.get(namespace, set())
            moved = was ^ now
            self._fill_clusters(namespace, (change.full & (was | now)) | moved, owned)
            touched = ((change.full | change.endpoints) & (was | now)) | moved
            self._fill_endpoints(namespace, touched, owned)
            if bool(was) != bool(now):
                self._relay(namespace, owned)
        self._stats.cluster_flavors = self.flavors
        return Changes(owned=owned)

    def _refresh(self, *, force: bool = False) -> None:
        """Work out which services differ where, if the rules (or services) changed."""
        if not force and self._generation == self._traffic.rules_generation:
            return
        self._generation = self._traffic.rules_generation
        services = self._index.services.keys()
        self._differ = {}
        for namespace in sorted(self._traffic.client_namespaces()):
            differing = self._traffic.differing(namespace, services)
            if differing:
                self._differ[namespace] = differing

    def _relay(self, namespace: str, owned: Owned) -> None:
        """A namespace started or stopped differing: its sidecars read its flavor or not."""
        for proxy, sidecar in sorted(self._sidecars.items(), key=lambda p: p[0].node_id):
            if sidecar.namespace != namespace:
                continue
            if self._differ.get(namespace):
                moved = self._read(proxy, sidecar)
            else:
                moved = self._unread(proxy, sidecar)
            for type_url, names in moved.items():
                owned.setdefault(proxy, {}).setdefault(type_url, set()).update(names)

    # -- tables ------------------------------------------------------------------------

    def _read(self, proxy: ProxyKey, sidecar: _Sidecar) -> dict[str, set[str]]:
        """Make `proxy` read its namespace's tables; returns the names it now reads there."""
        cds = self._cluster_table(sidecar.namespace)
        eds = self._endpoint_table(sidecar.namespace, sidecar.locality)
        # On every stream of the proxy that reads sidecars' clusters: its assignments are its
        # first stream's locality's (a later stream of the same node declares the same one).
        when = {types.CLUSTER: ADS_WITH_LISTENERS}
        self._cache.set_overlay(proxy, types.CLUSTER, cds.flavor, when, layer=LAYER)
        self._cache.set_overlay(proxy, types.ENDPOINT, eds.flavor, when, layer=LAYER)
        cds.readers.add(proxy)
        eds.readers.add(proxy)
        self._stats.cluster_flavors = self.flavors
        return {types.CLUSTER: _names(cds), types.ENDPOINT: _names(eds)}

    def _unread(self, proxy: ProxyKey, sidecar: _Sidecar) -> dict[str, set[str]]:
        """`proxy` no longer reads its namespace's tables: drop those nobody reads."""
        moved: dict[str, set[str]] = {}
        cds = _leave(self._cds, sidecar.namespace, proxy)
        eds = _leave(self._eds, (sidecar.namespace, sidecar.locality), proxy)
        for type_url, table in ((types.CLUSTER, cds), (types.ENDPOINT, eds)):
            if table is not None:
                moved[type_url] = _names(table)
                self._cache.set_overlay(proxy, type_url, None, layer=LAYER)
                if not table.readers:
                    self._cache.drop_flavor(type_url, table.flavor)
        self._stats.cluster_flavors = self.flavors
        return moved

    def _cluster_table(self, namespace: str) -> _Table:
        table = self._cds.get(namespace)
        if table is None:
            table = self._cds[namespace] = _Table(f"clusters@{next(self._ids)}")
            self._fill(
                types.CLUSTER, table, namespace, self._differ[namespace], self._cluster_builder()
            )
        return table

    def _endpoint_table(self, namespace: str, locality: Locality) -> _Table:
        table = self._eds.get((namespace, locality))
        if table is None:
            table = self._eds[(namespace, locality)] = _Table(f"endpoints@{next(self._ids)}")
            build = self._endpoint_builder(locality)
            self._fill(types.ENDPOINT, table, namespace, self._differ[namespace], build)
        return table

    def _cluster_builder(self) -> Builder:
        return Builder(ADS_WITH_LISTENERS, self._clusters.sidecar_clusters)

    def _endpoint_builder(self, locality: Locality) -> Builder:
        def build(key: ServiceKey, rule: DestinationRule | None) -> list[Resource]:
            return self._endpoints.assignments(key, rule, locality)

        return Builder(locality.flavor, build)

    def _fill_clusters(self, namespace: str, keys: Collection[ServiceKey], owned: Owned) -> None:
        table = self._cds.get(namespace)
        if table is not None and keys:
            changed = self._fill(types.CLUSTER, table, namespace, keys, self._cluster_builder())
            _own(owned, table.readers, types.CLUSTER, changed)

    def _fill_endpoints(self, namespace: str, keys: Collection[ServiceKey], owned: Owned) -> None:
        if not keys:
            return
        for (ns, locality), table in self._eds.items():
            if ns == namespace:
                build = self._endpoint_builder(locality)
                changed = self._fill(types.ENDPOINT, table, namespace, keys, build)
                _own(owned, table.readers, types.ENDPOINT, changed)

    def _fill(
        self,
        type_url: str,
        table: _Table,
        namespace: str,
        keys: Iterable[ServiceKey],
        build: Builder,
    ) -> set[str]:
        """Rebuild `keys` in `table` under `namespace`'s rules (dropping those it no longer
        differs on); returns the names whose bytes or visibility changed. A resource with
        the shared bytes is not held (the shared one is read, and pushed as shared)."""
        source, shared = self._shared(type_url, build.shared_flavor)
        differ = self._differ.get(namespace, set())
        upserts: list[Resource] = []
        removals: set[str] = set()
        for key in sorted(keys):
            built = (
                build.build(key, self._traffic.rule_for(key, namespace)) if key in differ else []
            )
            names = {r.name for r in built}
            own = [
                r for r in built if (same := shared(r.name)) is None or same.version != r.version
            ]
            removals |= table.built.pop(key, set()) - {r.name for r in own}
            upserts += own
            if own:
                table.built[key] = {r.name for r in own}
            hidden = source.shared_names(key) - names if key in differ else set()
            table.hidden.pop(key, None)
            if hidden:
                table.hidden[key] = hidden
        changed = self._cache.update(type_url, upserts, removals, flavor=table.flavor)
        hidden = set().union(*table.hidden.values())
        return changed | self._cache.hide(type_url, table.flavor, hidden)

    def _shared(
        self, type_url: str, flavor: str
    ) -> tuple[ClusterSource | EndpointSource, Callable[[str], Resource | None]]:
        """The generator of a type's shared resources, and the table the readers see."""
        source = self._clusters if type_url == types.CLUSTER else self._endpoints
        return source, self._cache.shared_table(type_url, flavor).get


def _leave(tables: dict[K, _Table], key: K, proxy: ProxyKey) -> _Table | None:
    """`proxy` leaves table `key` (None: it did not read it); a table left unread goes."""
    table = tables.get(key)
    if table is None or proxy not in table.readers:
        return None
    table.readers.discard(proxy)
    if not table.readers:
        del tables[key]
    return table


def _names(table: _Table) -> set[str]:
    """Every name a table changes for its readers: what it holds and what it hides."""
    return set().union(*table.built.values(), *table.hidden.values())


def _own(owned: Owned, readers: Iterable[ProxyKey], type_url: str, names: set[str]) -> None:
    if names:
        for proxy in readers:
            owned.setdefault(proxy, {}).setdefault(type_url, set()).update(names)
