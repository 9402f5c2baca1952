"""RDS: one route configuration per HTTP service port, one virtual host per service on it.

Route configuration `P` holds a virtual host `HOST:P` for each service with an
HTTP port P, routing to `outbound|P||HOST`, with Istio's domains: the FQDN,
`name.ns.svc`, `name.ns`, `name`, the ClusterIP, each with and without `:P`.
Envoy refuses a route configuration in which two virtual hosts share a
domain, so a domain two services would share (a short name used in two
namespaces, one ClusterIP given twice) is left out of both, and logged once:
Istio gives short names only to services in the proxy's own namespace (a route
configuration per namespace); pilot shares one configuration per port and
keeps a short name wherever it names one service.

Under ALLOW_ANY an `allow_any` virtual host (domain `*`) sends other hosts to
PassthroughCluster, under REGISTRY_ONLY `block_all` answers 502, as Istio. With
`INTERCEPTION_MODE: NONE` the listener is Envoy's own 127.0.0.1 port, whose
original destination is Envoy itself, so that flavor has neither: an unknown
host gets 404. Routes depend on services only: an endpoint change builds nothing.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf import duration_pb2

from pilot.generators.builder import BuildSettings
from pilot.generators.naming import outbound_cluster_name
from pilot.generators.outbound import OutboundSettings, TrafficPolicy, outbound_ports
from pilot.push.request import Changes, PushRequest
from pilot.registry.index import EndpointIndex
from pilot.registry.model import ServiceKey
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.interception import Interception
from pilot.xds.resource import Resource

log = logging.getLogger("pilot.xds")
MAX_SHARED_DOMAINS_LOGGED = 16


@dataclass(frozen=True, slots=True)
class HostRoute:
    """One service on one HTTP port, as its virtual host needs it."""

    key: ServiceKey
    hostname: str
    cluster: str
    cluster_ip: str


def candidate_domains(route: HostRoute, port: int) -> list[str]:
    """Istio's domains for a service port, before shared ones are left out."""
    name, namespace = route.key.name, route.key.namespace
    bare = [route.hostname, f"{name}.{namespace}.svc", f"{name}.{namespace}", name]
    if route.cluster_ip:
        bare.append(route.cluster_ip if ":" not in route.cluster_ip else f"[{route.cluster_ip}]")
    return [domain for host in bare for domain in (host, f"{host}:{port}")]


def virtual_host(route: HostRoute, port: int, domains: list[str]) -> rc_pb2.VirtualHost:
    """`HOST:P`: every path to the service's cluster (no route timeout, as Istio)."""
    return rc_pb2.VirtualHost(
        name=f"{route.hostname}:{port}",
        domains=domains,
        routes=[
            rc_pb2.Route(
                name="default",
                match=rc_pb2.RouteMatch(prefix="/"),
                route=rc_pb2.RouteAction(
                    cluster=route.cluster, timeout=duration_pb2.Duration(seconds=0)
                ),
            )
        ],
    )


def fallback_host(settings: OutboundSettings) -> rc_pb2.VirtualHost:
    """Hosts no service has: PassthroughCluster (ALLOW_ANY) or 502 (REGISTRY_ONLY)."""
    if settings.traffic_policy is TrafficPolicy.ALLOW_ANY:
        action = rc_pb2.Route(
            name="allow_any",
            match=rc_pb2.RouteMatch(prefix="/"),
            route=rc_pb2.RouteAction(
                cluster=settings.fallback_cluster, timeout=duration_pb2.Duration(seconds=0)
            ),
        )
        return rc_pb2.VirtualHost(name="allow_any", domains=["*"], routes=[action])
    block = rc_pb2.Route(
        name="block_all",
        match=rc_pb2.RouteMatch(prefix="/"),
        direct_response=rc_pb2.DirectResponseAction(status=502),
    )
    return rc_pb2.VirtualHost(name="block_all", domains=["*"], routes=[block])


def shared_domains(routes: list[HostRoute], port: int) -> set[str]:
    """Domains more than one of these services would claim."""
    counts = Counter(domain for route in routes for domain in candidate_domains(route, port))
    return {domain for domain, count in counts.items() if count > 1}


def virtual_hosts(routes: list[HostRoute], port: int, shared: set[str]) -> list[rc_pb2.VirtualHost]:
    """One virtual host per service, in a stable order, no domain in two of them."""
    hosts = []
    for route in sorted(routes, key=lambda r: r.key):
        domains = [d for d in candidate_domains(route, port) if d not in shared]
        hosts.append(virtual_host(route, port, domains))
    return hosts


class RouteGenerator:
    """The RDS generator: services' HTTP ports in, a route configuration per port out."""

    type_urls = frozenset({types.ROUTE})

    def __init__(
        self,
        index: EndpointIndex,
        cache: ResourceCache,
        settings: OutboundSettings,
        build: BuildSettings,
        stats: XdsStats,
    ) -> None:
        self._index = index
        self._cache = cache
        self._settings = settings
        self._domain = build.cluster_domain
        self._stats = stats
        self._by_port: dict[int, dict[ServiceKey, HostRoute]] = {}
        self._ports_of: dict[ServiceKey, set[int]] = {}
        self._logged: set[str] = set()  # shared domains logged once each

    def build(self, request: PushRequest) -> Changes:
        """Rebuild the route configurations of the ports the changed services had or have."""
        affected: set[int] = set()
        for key in sorted(request.registry.full):
            affected |= self._reclaim(key)
        changed: set[str] = set()
        for port in sorted(affected):
            changed |= self._rebuild(port)
        return Changes(shared={types.ROUTE: changed}) if changed else Changes()

    def _reclaim(self, key: ServiceKey) -> set[int]:
        old = self._ports_of.pop(key, set())
        for port in old:
            self._by_port[port].pop(key, None)
        service = self._index.services.get(key)
        new: set[int] = set()
        cluster_ip = service.cluster_ip if service is not None else ""
        for service_port, http in outbound_ports(service) if service is not None else []:
            if not http:
                continue
            cluster = outbound_cluster_name(key, service_port, self._domain)
            route = HostRoute(key, key.hostname(self._domain), cluster, cluster_ip)
            self._by_port.setdefault(service_port.port, {}).setdefault(key, route)
            new.add(service_port.port)
        if new:
            self._ports_of[key] = new
        return old | new

    def _rebuild(self, port: int) -> set[str]:
        name = str(port)
        routes = list(self._by_port.get(port, {}).values())
        if not routes:
            self._by_port.pop(port, None)
            return {
                n
                for mode in Interception
                for n in self._cache.update(types.ROUTE, [], [name], flavor=mode.value)
            }
        shared = shared_domains(routes, port)
        self._log_shared(name, shared)
        hosts = virtual_hosts(routes, port, shared)
        changed: set[str] = set()
        for mode in Interception:
            config = route_pb2.RouteConfiguration(name=name, virtual_hosts=hosts)
            if mode is Interception.REDIRECT:
                config.virtual_hosts.append(fallback_host(self._settings))
            resource = Resource.from_message(types.ROUTE, name, config)
            self._stats.serializations[types.ROUTE] += 1
            changed |= self._cache.update(types.ROUTE, [resource], flavor=mode.value)
        return changed

    def _log_shared(self, name: str, shared: set[str]) -> None:
        for domain in sorted(shared - self._logged):
            if len(self._logged) >= MAX_SHARED_DOMAINS_LOGGED:
                return
            self._logged.add(domain)
            log.warning(
                "route configuration %s: several services would answer to %r;"
                " it names none of them (use a longer name)",
                name,
                domain[:200],
            )
