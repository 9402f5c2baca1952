"""Route configurations, as pure functions: one virtual host per service on an HTTP port,
Istio's domains, the ones two services would share left out, and the fallback host.
A service's route carries Istio's default retry policy
(`pilot.builders.istio_defaults`); the fallback hosts have none, as Istio's. A
service a VirtualService names gets that object's routes instead
(`pilot.builders.virtual_routes`).
Every virtual host sends the app `x-envoy-attempt-count`, as Istio's.

The RDS generator (`pilot.generators.rds`) keeps which services are on which port and
calls these.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from google.protobuf import duration_pb2

from pilot.builders.istio_defaults import outbound_retry_policy
from pilot.builders.outbound import OutboundSettings, TrafficPolicy
from pilot.registry.model import ServiceKey


@dataclass(frozen=True, slots=True)
class HostRoute:
    """One service on one HTTP port, as its virtual host needs it."""

    key: ServiceKey
    hostname: str
    cluster: str
    cluster_ip: str


def candidate_domains(route: HostRoute) -> list[str]:
    """Istio's domains for a service port, before shared ones are left out."""
    name, namespace = route.key.name, route.key.namespace
    bare = [route.hostname, f"{name}.{namespace}.svc", f"{name}.{namespace}", name]
    if route.cluster_ip:
        bare.append(route.cluster_ip if ":" not in route.cluster_ip else f"[{route.cluster_ip}]")
    # No `host:P` forms: the route configuration ignores the port in Host, as istiod's.
    return bare


def default_route(route: HostRoute) -> rc_pb2.Route:
    """Every path to the service's cluster (no route timeout, Istio's default retries)."""
    action = rc_pb2.RouteAction(cluster=route.cluster, timeout=duration_pb2.Duration(seconds=0))
    # No timeout for gRPC either unless its grpc-timeout header sets one, as istiod.
    action.max_grpc_timeout.CopyFrom(action.timeout)
    action.retry_policy.CopyFrom(outbound_retry_policy())
    return rc_pb2.Route(name="default", match=rc_pb2.RouteMatch(prefix="/"), route=action)


def virtual_host(
    route: HostRoute, port: int, domains: list[str], routes: list[rc_pb2.Route] | None = None
) -> rc_pb2.VirtualHost:
    """`HOST:P`: the given routes (a VirtualService's), else the default route."""
    return rc_pb2.VirtualHost(
        name=f"{route.hostname}:{port}",
        domains=domains,
        routes=routes if routes is not None else [default_route(route)],
        include_request_attempt_count=True,
    )


def fallback_host(settings: OutboundSettings) -> rc_pb2.VirtualHost:
    """Hosts no service has: PassthroughCluster (ALLOW_ANY) or 502 (REGISTRY_ONLY)."""
    if settings.traffic_policy is TrafficPolicy.ALLOW_ANY:
        action = rc_pb2.Route(
            name="allow_any",
            match=rc_pb2.RouteMatch(prefix="/"),
            route=rc_pb2.RouteAction(
                cluster=settings.fallback_cluster,
                timeout=duration_pb2.Duration(seconds=0),
                max_grpc_timeout=duration_pb2.Duration(seconds=0),
            ),
        )
        return rc_pb2.VirtualHost(
            name="allow_any", domains=["*"], routes=[action], include_request_attempt_count=True
        )
    block = rc_pb2.Route(
        name="block_all",
        match=rc_pb2.RouteMatch(prefix="/"),
        direct_response=rc_pb2.DirectResponseAction(status=502),
    )
    return rc_pb2.VirtualHost(
        name="block_all", domains=["*"], routes=[block], include_request_attempt_count=True
    )


def shared_domains(routes: list[HostRoute]) -> set[str]:
    """Domains more than one of these services would claim."""
    counts = Counter(domain for route in routes for domain in candidate_domains(route))
    return {domain for domain, count in counts.items() if count > 1}


# A service's routes on a port from its VirtualService (None: it has none there).
RoutesOf = Callable[[HostRoute], list[rc_pb2.Route] | None]


def virtual_hosts(
    routes: list[HostRoute], port: int, shared: set[str], routes_of: RoutesOf | None = None
) -> list[rc_pb2.VirtualHost]:
    """One virtual host per service, in a stable order, no domain in two of them."""
    hosts = []
    for route in sorted(routes, key=lambda r: r.key):
        domains = [d for d in candidate_domains(route) if d not in shared]
        own = routes_of(route) if routes_of is not None else None
        hosts.append(virtual_host(route, port, domains, own))
    return hosts
