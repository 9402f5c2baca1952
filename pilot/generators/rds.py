"""RDS: one route configuration per HTTP service port, one virtual host per service on it.

Route configuration `P` holds a virtual host `HOST:P` for each service with an
HTTP port P, routing to `outbound|P||HOST`, with Istio's domains: the FQDN,
`name.ns.svc`, `name.ns`, `name`, the ClusterIP; the port in a request's Host is
ignored (`ignore_port_in_host_matching`), as istiod's.
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
host gets 404. Routes depend on services and VirtualServices only (a VirtualService's
change comes as its hosts' services in `PushRequest.routes`, which no other generator
reads; `pilot.generators.mesh_routes` picks the one each host follows): an endpoint
change builds nothing. A sidecar whose routes depend on who it is (a VirtualService
exported to its namespace alone, a `sourceLabels` match its Pod satisfies) reads a
flavor of the configurations that differ, built once per client and mode
(`pilot.generators.client_routes`); its Pod changing moves it to another (a
`workloads` change).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from envoy.config.route.v3 import route_pb2

from pilot.builders.naming import outbound_cluster_name
from pilot.builders.outbound import OutboundSettings, outbound_ports
from pilot.builders.routes import (
    HostRoute,
    candidate_domains,
    fallback_host,
    shared_domains,
    virtual_host,
    virtual_hosts,
)
from pilot.builders.settings import BuildSettings
from pilot.builders.virtual_routes import ANY_CLIENT, RouteClient
from pilot.generators.claims import ServiceClaims
from pilot.generators.client_routes import ClientRoutes
from pilot.generators.mesh_routes import MeshRoutes
from pilot.push.request import Changes, PushRequest
from pilot.registry.index import EndpointIndex
from pilot.registry.model import Service, ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.interception import Interception
from pilot.xds.locality import NOWHERE, Locality
from pilot.xds.proxy import ProxyKey
from pilot.xds.resource import Resource

log = logging.getLogger("pilot.xds")
MAX_SHARED_DOMAINS_LOGGED = 16


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
        *,
        traffic: TrafficConfig | None = None,
    ) -> None:
        self._index = index
        traffic = traffic if traffic is not None else TrafficConfig(build.cluster_domain)
        self._mesh = MeshRoutes(traffic, index, build.cluster_domain)
        self._cache = cache
        self._settings = settings
        self._domain = build.cluster_domain
        self._stats = stats
        self._routes: ServiceClaims[int, HostRoute] = ServiceClaims()  # by HTTP port
        self._logged: set[str] = set()  # shared domains logged once each
        # Each port's shared virtual hosts, in order, as last built: a client's flavor
        # copies those its routes do not change.
        self._shared_hosts: dict[int, list[route_pb2.VirtualHost]] = {}
        self._clients = ClientRoutes(
            index, cache, self._mesh, self, stats, max_flavors=settings.max_route_flavors
        )

    @property
    def flavors(self) -> int:
        """Route flavors held for sidecars whose routes depend on who they are."""
        return self._clients.flavors

    def client_joined(
        self, proxy: ProxyKey, interception: Interception, locality: Locality = NOWHERE
    ) -> None:
        """The first stream of `proxy` joined: it reads its own flavor, if it has one (routes
        are one for every locality)."""
        del locality
        self._clients.join(proxy, interception)

    def client_left(self, proxy: ProxyKey) -> None:
        self._clients.leave(proxy)

    def build(self, request: PushRequest) -> Changes:
        """Rebuild the route configurations of the ports the changed services had or have,
        the shared ones and the flavors of sidecars whose routes depend on who they are."""
        affected: set[int] = set()
        changed_services = request.registry.full | request.routes
        if changed_services:
            self._mesh.refresh()
        for key in sorted(changed_services):
            affected |= self._reclaim(key)
        changed: set[str] = set()
        for port in sorted(affected):
            changed |= self._rebuild(port)
        owned = self._clients.rebuild(affected, bool(changed_services), request.registry.workloads)
        shared = {types.ROUTE: changed} if changed else {}
        return Changes(shared=shared, owned=owned)

    def _reclaim(self, key: ServiceKey) -> set[int]:
        """Move a service's routes to the HTTP ports it has now; returns every port touched."""
        return self._routes.reclaim(key, self._routes_of(key, self._index.services.get(key)))

    def _routes_of(
        self, key: ServiceKey, service: Service | None
    ) -> Iterator[tuple[int, HostRoute]]:
        cluster_ip = service.cluster_ip if service is not None else ""
        for service_port, http in outbound_ports(service) if service is not None else []:
            if http:
                cluster = outbound_cluster_name(key, service_port, self._domain)
                yield (
                    service_port.port,
                    HostRoute(key, key.hostname(self._domain), cluster, cluster_ip),
                )

    def _rebuild(self, port: int) -> set[str]:
        name = str(port)
        hosts = self._hosts(port, ANY_CLIENT)
        changed: set[str] = set()
        for mode in Interception:
            if hosts is None:
                changed |= self._cache.update(types.ROUTE, [], [name], flavor=mode.value)
                continue
            resource = self._encode(port, mode, hosts)
            changed |= self._cache.update(types.ROUTE, [resource], flavor=mode.value)
        return changed

    def _hosts(self, port: int, client: RouteClient) -> list[route_pb2.VirtualHost] | None:
        """The virtual hosts of configuration `port` for `client` (None: no HTTP service).
        A client's reuses the shared ones where its routes do not differ from them."""
        routes = sorted(self._routes.of(port).values(), key=lambda r: r.key)
        if not routes:
            self._shared_hosts.pop(port, None)
            return None
        shared = shared_domains(routes)
        if not client:
            self._log_shared(str(port), shared)
            hosts = virtual_hosts(routes, port, shared, lambda r: self._mesh.routes(r, port))
            self._shared_hosts[port] = hosts
            return hosts
        base = self._shared_hosts.get(port)
        if base is None or len(base) != len(routes):
            return virtual_hosts(routes, port, shared, lambda r: self._mesh.routes(r, port, client))
        return [
            self._client_host(route, port, shared, client)
            if self._mesh.differs(route, port, client)
            else host
            for route, host in zip(routes, base, strict=True)
        ]

    def _client_host(
        self, route: HostRoute, port: int, shared: set[str], client: RouteClient
    ) -> route_pb2.VirtualHost:
        domains = [d for d in candidate_domains(route) if d not in shared]
        return virtual_host(route, port, domains, self._mesh.routes(route, port, client))

    def config(self, port: int, mode: Interception, client: RouteClient) -> Resource | None:
        """Route configuration `port` for sidecars of `mode` reading as `client` (None: no
        HTTP service on that port)."""
        hosts = self._hosts(port, client)
        return self._encode(port, mode, hosts) if hosts is not None else None

    def _encode(
        self, port: int, mode: Interception, hosts: list[route_pb2.VirtualHost]
    ) -> Resource:
        name = str(port)
        config = route_pb2.RouteConfiguration(
            name=name, virtual_hosts=hosts, ignore_port_in_host_matching=True
        )
        if mode is Interception.REDIRECT:
            config.virtual_hosts.append(fallback_host(self._settings))
        self._stats.serializations[types.ROUTE] += 1
        return Resource.from_message(types.ROUTE, name, config)

    def ports(self) -> list[int]:
        """Every port with a route configuration."""
        return self._routes.keys()

    def differs(self, port: int, client: RouteClient) -> bool:
        """Whether configuration `port` for `client` may differ from the shared one."""
        return any(self._mesh.differs(r, port, client) for r in self._routes.of(port).values())

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
