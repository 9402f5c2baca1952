"""ClusterLoadAssignments: a Service port's endpoints, grouped by locality (zone).

Endpoints are matched to the Service port by port name (the slice lists the
resolved targetPort under the Service port's name). Ready endpoints are
HEALTHY, serving-but-terminating ones DRAINING, others are left out. The same
address:port from several slices appears once, with its best health. Output is
sorted, so equal content serializes to equal bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy.config.core.v3 import base_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2

from pilot.registry.model import EndpointSet, Health, ServicePort

_HEALTH_STATUS = {
    Health.HEALTHY: health_check_pb2.HEALTHY,
    Health.DRAINING: health_check_pb2.DRAINING,
}
_PREFERENCE = {Health.HEALTHY: 0, Health.DRAINING: 1}

HostKey = tuple[str, int]


def collect_hosts(
    port: ServicePort, endpoint_sets: Iterable[EndpointSet]
) -> dict[HostKey, tuple[Health, str]]:
    """address:port -> (health, zone) for one Service port."""
    hosts: dict[HostKey, tuple[Health, str]] = {}
    for endpoint_set in endpoint_sets:
        for group in endpoint_set.groups:
            number = group.port_named(port.name)
            if number is None:
                continue
            for endpoint in group.endpoints:
                health = endpoint.health
                if health is None:
                    continue
                for address in endpoint.addresses:
                    key = (address, number)
                    known = hosts.get(key)
                    if known is None or _PREFERENCE[health] < _PREFERENCE[known[0]]:
                        hosts[key] = (health, endpoint.zone)
    return hosts


def _lb_endpoint(address: str, port: int, health: Health) -> endpoint_components_pb2.LbEndpoint:
    lb_endpoint = endpoint_components_pb2.LbEndpoint(health_status=_HEALTH_STATUS[health])
    socket_address = lb_endpoint.endpoint.address.socket_address
    socket_address.address = address
    socket_address.port_value = port
    return lb_endpoint


def build_load_assignment(
    cluster_name: str, port: ServicePort, endpoint_sets: Iterable[EndpointSet]
) -> endpoint_pb2.ClusterLoadAssignment:
    """The assignment for one Service port; empty (not absent) when it has no endpoints."""
    by_zone: dict[str, list[endpoint_components_pb2.LbEndpoint]] = {}
    for (address, number), (health, zone) in sorted(collect_hosts(port, endpoint_sets).items()):
        by_zone.setdefault(zone, []).append(_lb_endpoint(address, number, health))
    assignment = endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster_name)
    for zone in sorted(by_zone):
        assignment.endpoints.append(
            endpoint_components_pb2.LocalityLbEndpoints(
                locality=base_pb2.Locality(zone=zone), lb_endpoints=by_zone[zone]
            )
        )
    return assignment
