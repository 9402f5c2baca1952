"""Which VirtualService a service's virtual host follows on sidecars, and its Envoy routes.

Only VirtualServices for mesh traffic (`gateways` absent or naming `mesh`) that every
sidecar sees (`exportTo` absent or `*`) are taken: route configurations are shared
by every sidecar, so an object exported to fewer namespaces is held and listed but
routes nothing (as `pilot.registry.traffic_config` does with DestinationRules).
A VirtualService routes a service's host only if it is written in that service's
namespace or the root namespace (`istio-system`): the routes every sidecar shares
never follow what another namespace's owner wrote for someone else's service (Istio
would take it, and a `mirror` there would copy that service's traffic away); it is
held, listed, logged once and ignored for that host, as DestinationRules are.
Several VirtualServices for one host are not merged for sidecars, as Istio's
(its analyzer's IST0109, ConflictingMeshGatewayVirtualServiceHosts): the oldest
(`creationTimestamp`, then namespace and name) routes the host, the others are
logged once and ignored for it. An exact host wins over a wildcard one, the
longest wildcard over shorter ones.

A tcp route (`tcp_route`) gives a TCP port's listener its destinations: the first
route whose match takes the port (and the ClusterIP, for `destinationSubnets`), as
the TCP proxy's weighted clusters.

A destination names `outbound|PORT|SUBSET|FQDN`: PORT is the destination's port,
else the service's only port, else the port of the route configuration, as istiod.
"""

from __future__ import annotations

import ipaddress
import logging

from envoy.config.route.v3 import route_components_pb2 as rc_pb2

from pilot.builders.routes import HostRoute
from pilot.builders.virtual_routes import envoy_routes
from pilot.registry.index import EndpointIndex
from pilot.registry.istio_config import exported_to_all, host_matches
from pilot.registry.model import ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.registry.virtual_service import Destination, TcpMatch, VirtualService

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


class MeshRoutes:
    """The VirtualServices sidecars follow, by host, and the routes they make."""

    def __init__(self, traffic: TrafficConfig, index: EndpointIndex, cluster_domain: str) -> None:
        self._traffic = traffic
        self._index = index
        self._domain = cluster_domain
        self._exact: dict[str, VirtualService] = {}
        self._wildcards: list[VirtualService] = []
        self._logged: set[tuple[str, str]] = set()

    def refresh(self) -> None:
        """Re-read the VirtualServices held (once per build)."""
        exact: dict[str, VirtualService] = {}
        wildcards: list[VirtualService] = []
        candidates = [
            vs
            for vs in self._traffic.virtual_services()
            if vs.for_mesh and exported_to_all(vs.export_to)
        ]
        for vs in sorted(candidates, key=_age):
            for host in vs.hosts:
                if host.startswith("*"):
                    wildcards.append(vs)
                elif not self._may_route(vs, host):
                    self._log_foreign(host, vs)
                elif host in exact and exact[host] is not vs:
                    self._log_conflict(host, exact[host], vs)
                else:
                    exact.setdefault(host, vs)
        self._exact, self._wildcards = exact, wildcards

    def _may_route(self, vs: VirtualService, host: str) -> bool:
        """Whether `vs` may route `host` for every sidecar: written in the namespace of the
        host's service, or in the root namespace (a service outside the cluster's
        domain has no owner here: any namespace's)."""
        owner = _service_namespace(host, self._domain)
        return owner is None or vs.key.namespace in (owner, self._traffic.root_namespace)

    def _log_foreign(self, host: str, vs: VirtualService) -> None:
        key = (host, f"foreign {vs.key}")
        if key in self._logged or len(self._logged) >= MAX_CONFLICTS_LOGGED:
            return
        self._logged.add(key)
        log.warning(
            "VirtualService %s/%s: host %s is another namespace's service; pilot lets only"
            " that namespace (or %s) route it for every sidecar: ignored there",
            vs.key.namespace,
            vs.key.name,
            host[:200],
            self._traffic.root_namespace,
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

    def for_host(self, host: str) -> VirtualService | None:
        found = self._exact.get(host)
        if found is not None:
            return found
        matching = [
            (len(h), vs)
            for vs in self._wildcards
            for h in vs.hosts
            if host_matches(h, host) and self._may_route(vs, host)
        ]
        if not matching:
            return None
        longest = max(length for length, _ in matching)
        return next(vs for length, vs in matching if length == longest)

    def routes(self, route: HostRoute, port: int) -> list[rc_pb2.Route] | None:
        """The routes of the service's VirtualService on `port` (None: it has none)."""
        vs = self.for_host(route.hostname)
        if vs is None or not vs.http:
            return None
        return list(envoy_routes(vs.http, port, lambda d: self.cluster_name(d, port)))

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
