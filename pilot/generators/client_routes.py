"""Route configurations of their own for the sidecars whose routes depend on who they are.

A route configuration `P` is shared by every sidecar of an interception mode while
nothing in it depends on who asks. Some VirtualServices do: one exported to fewer
than every namespace, one in a client's namespace for another namespace's host, a
match naming `sourceNamespace` or `sourceLabels` (`pilot.generators.mesh_routes`).
A sidecar they concern reads a *flavor* of the route configurations: the ones its
routes make differ (same names, as istiod's), laid over the shared ones for its
streams alone (`ResourceCache.set_overlay`), in a table built once per
`RouteClient` and mode and shared by every sidecar with that client and mode:

- a namespace whose selection differs from the shared one, or that a
  `sourceNamespace` names, gives its sidecars one flavor;
- `sourceLabels` give one per (namespace, set of selectors matched), shared by the
  pods that match the same set; a namespace with nothing of its own is left out of
  the key, so pods of several namespaces matching the same selectors share one.

Who a sidecar is comes from what it proved and the registry, as its inbound side
(`pilot.generators.inbound_proxies`): its namespace is its proven identity's (a
stream that proved none reads the shared routes: a claimed namespace would read
another namespace's private routes), its labels those of the one Pod of that
namespace at the IP of its node id whose service account is its identity's (none,
several, or another account's: no labels, so no `sourceLabels` route; the namespace
flavor still applies). What a node claims beyond its IP picks nothing.

Bounded: a table lives while a sidecar reads it (dropped with the last one, as EDS's
locality variants), so there are at most as many as connected sidecars with a
proven identity, and no more than the distinct (namespace, matched selectors, mode)
the registry's VirtualServices give them; a table holds only the ports whose
configuration differs from the shared one. When no VirtualService depends on the
client, no sidecar is looked at.

What a change pushes: a rebuild of port P rebuilds P in the tables that hold it (or
should now), and each table's changes go to its readers alone (`Changes.owned`);
a sidecar whose client changed (a relabelled Pod, a VirtualService change, its Pod
arriving) moves to its new table and is sent the configurations that differ.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from pilot.builders.virtual_routes import ANY_CLIENT, RouteClient
from pilot.generators.inbound_proxies import sidecar_of
from pilot.generators.mesh_routes import MeshRoutes
from pilot.registry.index import EndpointIndex
from pilot.registry.virtual_service import Pairs
from pilot.security.identity import Identity
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.interception import Interception
from pilot.xds.proxy import ProxyKey
from pilot.xds.resource import Resource

log = logging.getLogger("pilot.xds")

TableKey = tuple[RouteClient, Interception]
Owned = dict[ProxyKey, dict[str, set[str]]]


class RouteSource(Protocol):
    """What builds the route configurations (the RDS generator)."""

    def ports(self) -> Iterable[int]:
        """Every port with a route configuration."""
        ...

    def differs(self, port: int, client: RouteClient) -> bool:
        """Whether configuration `port` for `client` may differ from the shared one."""
        ...

    def config(self, port: int, mode: Interception, client: RouteClient) -> Resource | None:
        """Configuration `port` for `client` in `mode` (None: no service there)."""
        ...


@dataclass(slots=True)
class _Table:
    """One client's flavor in one mode: its cache table and who reads it."""

    flavor: str
    readers: set[ProxyKey] = field(default_factory=set)


@dataclass(slots=True)
class _Sidecar:
    """An attached proxy: where it is, what it proved, and the client it reads as."""

    ip: str
    namespace: str  # proven ("" : proved none)
    account: str
    mode: Interception
    client: RouteClient = ANY_CLIENT


def proven(proxy: ProxyKey) -> tuple[str, str] | None:
    """(namespace, service account) of the identity a proxy proved; None: none."""
    if proxy.identity is None:
        return None
    try:
        identity = Identity.parse(proxy.identity)
    except ValueError:
        return None
    return identity.namespace, identity.service_account


class ClientRoutes:
    """The route flavors of the sidecars whose routes depend on who they are."""

    def __init__(
        self,
        index: EndpointIndex,
        cache: ResourceCache,
        mesh: MeshRoutes,
        source: RouteSource,
        stats: XdsStats,
    ) -> None:
        self._index = index
        self._cache = cache
        self._mesh = mesh
        self._source = source
        self._stats = stats
        self._ids = itertools.count(1)
        self._sidecars: dict[ProxyKey, _Sidecar] = {}
        self._at_ip: dict[str, set[ProxyKey]] = {}
        self._tables: dict[TableKey, _Table] = {}

    @property
    def flavors(self) -> int:
        """Route tables held (one per client and mode some sidecar reads)."""
        return len(self._tables)

    def client(self, proxy: ProxyKey) -> RouteClient:
        """The client a proxy's routes are built for (ANY_CLIENT: the shared ones)."""
        sidecar = self._sidecars.get(proxy)
        return sidecar.client if sidecar is not None else ANY_CLIENT

    # -- sidecars come and go ------------------------------------------------------

    def join(self, proxy: ProxyKey, mode: Interception) -> None:
        """The first stream of `proxy` joined: lay its flavor (before it is answered)."""
        where = sidecar_of(proxy.node_id)
        identity = proven(proxy)
        if where is None or identity is None:
            return
        sidecar = _Sidecar(where[0], identity[0], identity[1], mode)
        self._sidecars[proxy] = sidecar
        self._at_ip.setdefault(sidecar.ip, set()).add(proxy)
        self._move(proxy, sidecar, self._client_of(sidecar))

    def leave(self, proxy: ProxyKey) -> None:
        sidecar = self._sidecars.pop(proxy, None)
        if sidecar is None:
            return
        at = self._at_ip[sidecar.ip]
        at.discard(proxy)
        if not at:
            del self._at_ip[sidecar.ip]
        self._unread(proxy, sidecar)
        self._cache.set_overlay(proxy, types.ROUTE, None)

    # -- what a build changes -------------------------------------------------------

    def rebuild(self, ports: set[int], everyone: bool, workloads: Iterable[str]) -> Owned:
        """Rebuild `ports` in every table, then move the sidecars whose client changed:
        every one when VirtualServices or services changed (`everyone`), else those at
        `workloads` (their Pod changed). Returns the names that moved, per proxy."""
        owned: Owned = {}
        for key, table in list(self._tables.items()):
            changed = self._fill(table, key, ports)
            for proxy in table.readers if changed else ():
                owned.setdefault(proxy, {}).setdefault(types.ROUTE, set()).update(changed)
        if everyone:
            who: Iterable[ProxyKey] = list(self._sidecars)
        else:
            who = {p for ip in workloads for p in self._at_ip.get(ip, ())}
        for proxy in sorted(who, key=lambda p: (p.node_id, p.identity or "")):
            sidecar = self._sidecars[proxy]
            client = self._client_of(sidecar)
            if client != sidecar.client:
                moved = self._move(proxy, sidecar, client)
                if moved:
                    owned.setdefault(proxy, {}).setdefault(types.ROUTE, set()).update(moved)
        return owned

    def _client_of(self, sidecar: _Sidecar) -> RouteClient:
        if not self._mesh.client_dependent:
            return ANY_CLIENT
        return self._mesh.client_of(sidecar.namespace, self._labels(sidecar))

    def _labels(self, sidecar: _Sidecar) -> Pairs | None:
        """The labels of the sidecar's own Pod: the one of its namespace at its IP, run
        under its proven account (None: no such one Pod, or its labels not kept)."""
        pods = self._index.pods_in(sidecar.namespace, sidecar.ip)
        if len(pods) != 1 or pods[0].service_account != sidecar.account:
            return None
        return pods[0].labels

    def _move(self, proxy: ProxyKey, sidecar: _Sidecar, client: RouteClient) -> set[str]:
        """Make `proxy` read `client`'s flavor; returns the names whose bytes may move."""
        before = self._names(sidecar)
        self._unread(proxy, sidecar)
        sidecar.client = client
        if not client:
            self._cache.set_overlay(proxy, types.ROUTE, None)
            return before
        table = self._table((client, sidecar.mode))
        table.readers.add(proxy)
        self._cache.set_overlay(proxy, types.ROUTE, table.flavor, {types.ROUTE: sidecar.mode})
        return before | set(self._cache.shared_table(types.ROUTE, table.flavor))

    def _names(self, sidecar: _Sidecar) -> set[str]:
        table = self._tables.get((sidecar.client, sidecar.mode)) if sidecar.client else None
        return set(self._cache.shared_table(types.ROUTE, table.flavor)) if table else set()

    def _unread(self, proxy: ProxyKey, sidecar: _Sidecar) -> None:
        key = (sidecar.client, sidecar.mode)
        table = self._tables.get(key) if sidecar.client else None
        if table is None:
            return
        table.readers.discard(proxy)
        if not table.readers:
            del self._tables[key]
            self._cache.drop_flavor(types.ROUTE, table.flavor)
            self._stats.route_flavors = len(self._tables)

    def _table(self, key: TableKey) -> _Table:
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = _Table(f"routes#{next(self._ids)}")
            self._stats.route_flavors = len(self._tables)
            self._fill(table, key, set(self._source.ports()))
        return table

    def _fill(self, table: _Table, key: TableKey, ports: set[int]) -> set[str]:
        """Build `ports` of the table where they differ from the shared ones, drop them
        where they no longer do; returns the names that changed."""
        client, mode = key
        upserts: list[Resource] = []
        removals: list[str] = []
        for port in sorted(ports):
            differs = self._source.differs(port, client)
            built = self._source.config(port, mode, client) if differs else None
            if built is None:
                removals.append(str(port))
            else:
                upserts.append(built)
        return self._cache.update(types.ROUTE, upserts, removals, flavor=table.flavor)
