"""Which VirtualService a service's virtual host follows on sidecars, and its Envoy routes.

Only VirtualServices for mesh traffic (`gateways` absent or naming `mesh`) are taken.
Which ones a sidecar sees depends on its namespace N, as Istio's sidecar scope
(`SelectVirtualServices` over `virtualServiceIndex`): the ones private to N (in N with
`exportTo` `.` or N), then the ones other namespaces export to N by name, then the
public ones (`exportTo` absent or `*`), each tier oldest first; the first that names a
host routes it (an exact host before a wildcard, the longest wildcard before shorter
ones). The *shared* selection, which every sidecar reads unless its namespace changes
something, takes the public tier alone.

A VirtualService routes a service's host only for the sidecars of the service's own
namespace, of the root namespace (`istio-system`) when it is written there, and of its
own namespace: one written in N for another namespace's service routes N's sidecars
(as Istio) and no one else's (Istio would take a public one for every sidecar, and a
`mirror` there would copy that service's traffic away); the shared selection ignores
it, logged once. Several VirtualServices for one host are not merged for sidecars, as
Istio's (its analyzer's IST0109, ConflictingMeshGatewayVirtualServiceHosts): the first
by the order above routes the host, the others are logged once (shared selection) and
ignored for it.

A namespace whose selection is the shared one and that no `sourceNamespace` names
reads the shared routes; `client_of` says which `RouteClient` (namespace, matching
`sourceLabels` selectors) a sidecar's routes are built for, and `differs` whether a
host's routes for it differ from the shared ones.

A tcp route (`tcp_route`) gives a TCP port's listener its destinations: the first
route whose match takes the port (and the ClusterIP, for `destinationSubnets`), as
the TCP proxy's weighted clusters. Listeners are shared by every sidecar: a tcp match
naming `sourceLabels` or `sourceNamespace` takes no connection there.

A destination names `outbound|PORT|SUBSET|FQDN`: PORT is the destination's port,
else the service's only port, else the port of the route configuration, as istiod.
"""

from __future__ import annotations

import ipaddress
import logging

from envoy.config.route.v3 import route_components_pb2 as rc_pb2

from pilot.builders.routes import HostRoute
from pilot.builders.virtual_routes import (
    ANY_CLIENT,
    RouteClient,
    depends_on_client,
    envoy_routes,
    selects,
)
from pilot.registry.index import EndpointIndex
from pilot.registry.istio_config import EXPORT_SELF, exported_to_all, host_matches
from pilot.registry.model import ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.registry.virtual_service import Destination, Pairs, TcpMatch, VirtualService

log = logging.getLogger("pilot.xds")
MAX_CONFLICTS_LOGGED = 16


def _tcp_matches(match: TcpMatch, cluster_ip: str, port: int) -> bool:
    """Whether a tcp match takes every sidecar's connections to `cluster_ip:port` (one that
    selects its clients by labels or namespace takes none in the shared listener)."""
    if match.source_labels or match.source_namespace:
        return False
    if match.port is not None and match.port != port:
        return False
    if not match.destination_subnets:
        return True
    try:
        address = ipaddress.ip_address(cluster_ip)
    except ValueError:
        return False
    return any(
        address in ipaddress.ip_network(subnet, strict=False)
        for subnet in match.destination_subnets
    )


def _service_key(host: str, domain: str) -> ServiceKey | None:
    """The Service `name.ns.svc.<domain>` names (None: not a service of the cluster)."""
    suffix = f".svc.{domain}"
    parts = host.removesuffix(suffix).split(".") if host.endswith(suffix) else []
    return ServiceKey(parts[1], parts[0]) if len(parts) == 2 else None


def _service_namespace(host: str, domain: str) -> str | None:
    key = _service_key(host, domain)
    return key.namespace if key is not None else None


def _age(vs: VirtualService) -> tuple[str, str, str]:
    return (vs.created or "~", vs.key.namespace, vs.key.name)


class _Selection:
    """The VirtualService each host follows, for the sidecars of one namespace (or all)."""

    def __init__(self, namespace: str, owners: _Owners) -> None:
        self.namespace = namespace
        self._owners = owners
        self.exact: dict[str, VirtualService] = {}
        self.wildcards: list[VirtualService] = []  # in precedence order

    def take(self, vs: VirtualService) -> list[tuple[str, VirtualService]]:
        """Let `vs` route the hosts no earlier one took; returns the (host, earlier) pairs
        it lost, and the hosts it may not route (earlier: itself)."""
        lost: list[tuple[str, VirtualService]] = []
        for host in vs.hosts:
            if host.startswith("*"):
                if vs not in self.wildcards:
                    self.wildcards.append(vs)
            elif not self._owners.may_route(vs, host, self.namespace):
                lost.append((host, vs))
            elif host in self.exact and self.exact[host] is not vs:
                lost.append((host, self.exact[host]))
            else:
                self.exact.setdefault(host, vs)
        return lost

    def for_host(self, host: str) -> VirtualService | None:
        found = self.exact.get(host)
        if found is not None:
            return found
        best: tuple[int, VirtualService] | None = None
        for vs in self.wildcards:  # the first of the longest: precedence kept among equals
            for pattern in vs.hosts:
                longer = best is None or len(pattern) > best[0]
                if longer and host_matches(pattern, host) and self._may(vs, host):
                    best = (len(pattern), vs)
        return best[1] if best is not None else None

    def _may(self, vs: VirtualService, host: str) -> bool:
        return self._owners.may_route(vs, host, self.namespace)

    def chosen(self) -> list[VirtualService]:
        """Every VirtualService this selection may follow somewhere, without repeats."""
        return list({id(vs): vs for vs in (*self.exact.values(), *self.wildcards)}.values())


class _Owners:
    """Which namespace owns a host: a VirtualService routes it only for some sidecars."""

    def __init__(self, domain: str, root: str) -> None:
        self._domain = domain
        self._root = root

    def may_route(self, vs: VirtualService, host: str, client_namespace: str) -> bool:
        """Whether `vs` may route `host` for the sidecars of `client_namespace` ("": all):
        written in the host's service's namespace, the root namespace, or the client's
        own (a host outside the cluster's domain has no owner here: any namespace's)."""
        owner = _service_namespace(host, self._domain)
        if owner is None:
            return True
        return vs.key.namespace in (owner, self._root) or vs.key.namespace == client_namespace


def _has_selectors(vs: VirtualService) -> bool:
    return any(m.source_labels for r in vs.http for m in r.matches)


def _private_to(vs: VirtualService) -> bool:
    return EXPORT_SELF in vs.export_to or vs.key.namespace in vs.export_to


class MeshRoutes:
    """The VirtualServices sidecars follow, by namespace and host, and the routes they make."""

    def __init__(self, traffic: TrafficConfig, index: EndpointIndex, cluster_domain: str) -> None:
        self._traffic = traffic
        self._index = index
        self._domain = cluster_domain
        self._owners = _Owners(cluster_domain, traffic.root_namespace)
        self._shared = _Selection("", self._owners)
        self._public: list[VirtualService] = []
        self._private: dict[str, list[VirtualService]] = {}  # by namespace
        self._exported: dict[str, list[VirtualService]] = {}  # by the namespace named
        self._source_namespaces: set[str] = set()  # named by some http match
        self._selections: dict[str, _Selection] = {}  # namespaces asked since the refresh
        self._selectors: dict[str, tuple[Pairs, ...]] = {}
        self._logged: set[tuple[str, str]] = set()
        # Whether any sidecar could read routes of its own (else: no flavor at all).
        self.client_dependent = False

    def refresh(self) -> None:
        """Re-read the VirtualServices held (once per build)."""
        public: list[VirtualService] = []
        private: dict[str, list[VirtualService]] = {}
        exported: dict[str, list[VirtualService]] = {}
        sources: set[str] = set()
        candidates = [vs for vs in self._traffic.virtual_services() if vs.for_mesh]
        for vs in sorted(candidates, key=_age):
            sources |= {m.source_namespace for r in vs.http for m in r.matches}
            if exported_to_all(vs.export_to):
                public.append(vs)
                continue
            if _private_to(vs):
                private.setdefault(vs.key.namespace, []).append(vs)
            for namespace in vs.export_to:
                if namespace not in (EXPORT_SELF, vs.key.namespace):
                    exported.setdefault(namespace, []).append(vs)
        shared = _Selection("", self._owners)
        for vs in public:
            for host, kept in shared.take(vs):
                if kept is vs:
                    self._log_foreign(host, vs)
                else:
                    self._log_conflict(host, kept, vs)
        self._public, self._private, self._exported = public, private, exported
        self._source_namespaces = sources - {""}
        self._shared = shared
        self._selections.clear()
        self._selectors.clear()
        self.client_dependent = bool(private or exported or self._source_namespaces) or any(
            self._routes_foreign(vs) or _has_selectors(vs) for vs in public
        )

    def _selection(self, namespace: str) -> _Selection:
        """What the sidecars of `namespace` follow (the shared selection when nothing of
        theirs differs from it)."""
        if not namespace:
            return self._shared
        found = self._selections.get(namespace)
        if found is not None:
            return found
        own = self._private.get(namespace, [])
        given = self._exported.get(namespace, [])
        foreign = [vs for vs in self._public if vs.key.namespace == namespace]
        if not own and not given and not any(self._routes_foreign(vs) for vs in foreign):
            found = self._shared
        else:
            found = _Selection(namespace, self._owners)
            for vs in (*own, *given, *self._public):
                found.take(vs)
        self._selections[namespace] = found
        return found

    def _routes_foreign(self, vs: VirtualService) -> bool:
        return any(
            not h.startswith("*") and not self._owners.may_route(vs, h, "") for h in vs.hosts
        )

    def client_of(self, namespace: str, labels: Pairs | None) -> RouteClient:
        """The client a sidecar of `namespace` whose Pod has `labels` (None: no Pod known)
        is, as far as its routes go: ANY_CLIENT when it reads the shared ones."""
        selection = self._selection(namespace)
        mine = selection is not self._shared or namespace in self._source_namespaces
        held = set(labels or ())
        matching = (
            frozenset(s for s in self._selectors_of(namespace) if held.issuperset(s))
            if labels is not None
            else frozenset()
        )
        return RouteClient(namespace if mine else "", matching)

    def _selectors_of(self, namespace: str) -> tuple[Pairs, ...]:
        """The distinct `sourceLabels` of the VirtualServices a namespace's sidecars follow."""
        found = self._selectors.get(namespace)
        if found is None:
            chosen = self._selection(namespace).chosen()
            found = tuple(
                sorted(
                    {m.source_labels for vs in chosen for r in vs.http for m in r.matches} - {()}
                )
            )
            self._selectors[namespace] = found
        return found

    def _log_foreign(self, host: str, vs: VirtualService) -> None:
        key = (host, f"foreign {vs.key}")
        if key in self._logged or len(self._logged) >= MAX_CONFLICTS_LOGGED:
            return
        self._logged.add(key)
        log.warning(
            "VirtualService %s/%s: host %s is another namespace's service; pilot lets only"
            " that namespace (or %s) route it for every sidecar: it routes it for %s's"
            " sidecars alone",
            vs.key.namespace,
            vs.key.name,
            host[:200],
            self._traffic.root_namespace,
            vs.key.namespace,
        )

    def _log_conflict(self, host: str, kept: VirtualService, ignored: VirtualService) -> None:
        key = (host, str(ignored.key))
        if key in self._logged or len(self._logged) >= MAX_CONFLICTS_LOGGED:
            return
        self._logged.add(key)
        log.warning(
            "VirtualService %s/%s: host %s is already routed by the older %s/%s;"
            " sidecars ignore it there, as Istio's (merge them into one)",
            ignored.key.namespace,
            ignored.key.name,
            host[:200],
            kept.key.namespace,
            kept.key.name,
        )

    def for_host(self, host: str, client: RouteClient = ANY_CLIENT) -> VirtualService | None:
        return self._selection(client.namespace).for_host(host)

    def routes(
        self, route: HostRoute, port: int, client: RouteClient = ANY_CLIENT
    ) -> list[rc_pb2.Route] | None:
        """The routes of the service's VirtualService on `port` for `client` (None: it has
        none)."""
        vs = self.for_host(route.hostname, client)
        if vs is None or not vs.http:
            return None
        cluster_of = lambda d: self.cluster_name(d, port)  # noqa: E731
        return list(envoy_routes(vs.http, port, cluster_of, client))

    def differs(self, route: HostRoute, port: int, client: RouteClient) -> bool:
        """Whether the service's routes on `port` for `client` may differ from the shared
        ones: another VirtualService routes it, or one of its matches selects `client`."""
        vs = self.for_host(route.hostname, client)
        if vs is not self._shared.for_host(route.hostname):
            return True
        return vs is not None and any(
            depends_on_client(m) and (m.port is None or m.port == port) and selects(m, client)
            for r in vs.http
            for m in r.matches
        )

    def tcp_route(self, host: str, cluster_ip: str, port: int) -> tuple[tuple[str, int], ...]:
        """The (cluster, weight) pairs of the first tcp route of the host's VirtualService
        that matches connections to `cluster_ip:port` from every sidecar; () for none."""
        vs = self.for_host(host)
        for route in vs.tcp if vs is not None else ():
            if not route.matches or any(_tcp_matches(m, cluster_ip, port) for m in route.matches):
                weighted = [d for d in route.route if d.weight > 0] or list(route.route[:1])
                return tuple(
                    (self.cluster_name(d.destination, port), d.weight or 1) for d in weighted
                )
        return ()

    def cluster_name(self, destination: Destination, port: int) -> str:
        number = destination.port or self._only_port(destination.host) or port
        return f"outbound|{number}|{destination.subset}|{destination.host}"

    def _only_port(self, host: str) -> int | None:
        key = _service_key(host, self._domain)
        service = self._index.services.get(key) if key is not None else None
        if service is None or len(service.ports) != 1:
            return None
        return service.ports[0].port
