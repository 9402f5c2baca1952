"""ClusterLoadAssignments: a Service port's endpoints, grouped by locality (zone).

Endpoints are matched to the Service port by port name (the slice lists the
resolved targetPort under the Service port's name). Ready endpoints are
HEALTHY, serving-but-terminating ones DRAINING, others are left out. The same
address:port from several slices appears once, with its best health. Output is
sorted, so equal content serializes to equal bytes. Each endpoint carries the
id of the cluster it came from in its metadata (`istio` / `cluster_id`), so
Envoy's access logs (`%UPSTREAM_METADATA(istio:cluster_id)%`) tell them apart.

The assignment is encoded by hand from each endpoint's encoded `LbEndpoint`,
kept in a bounded cache: one endpoint of 5,000 changing re-encodes one, not
5,000 messages. The bytes are exactly protobuf's deterministic serialization
(a test holds them to it), so versions do not depend on which encoder ran.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2

from pilot.registry.model import EndpointSet, Health, ServicePort
from pilot.xds.resource import length_delimited

ENCODED_ENDPOINTS = 1 << 16  # LbEndpoints kept encoded (~150 bytes each)

_HEALTH_STATUS = {
    Health.HEALTHY: health_check_pb2.HEALTHY,
    Health.DRAINING: health_check_pb2.DRAINING,
}
_PREFERENCE = {Health.HEALTHY: 0, Health.DRAINING: 1}

HostKey = tuple[str, int]
Host = tuple[Health, str, str]  # health, zone, cluster id
METADATA_KEY = "istio"
CLUSTER_ID_FIELD = "cluster_id"


def collect_hosts(port: ServicePort, endpoint_sets: Iterable[EndpointSet]) -> dict[HostKey, Host]:
    """address:port -> (health, zone, cluster) for one Service port."""
    hosts: dict[HostKey, Host] = {}
    for endpoint_set in endpoint_sets:
        cluster = endpoint_set.key.cluster
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
                        hosts[key] = (health, endpoint.zone, cluster)
    return hosts


def _lb_endpoint(
    address: str, port: int, health: Health, cluster: str
) -> endpoint_components_pb2.LbEndpoint:
    lb_endpoint = endpoint_components_pb2.LbEndpoint(health_status=_HEALTH_STATUS[health])
    socket_address = lb_endpoint.endpoint.address.socket_address
    socket_address.address = address
    socket_address.port_value = port
    if cluster:
        lb_endpoint.metadata.filter_metadata[METADATA_KEY][CLUSTER_ID_FIELD] = cluster
    return lb_endpoint


@functools.lru_cache(maxsize=ENCODED_ENDPOINTS)
def _encoded_lb_endpoint(address: str, port: int, health: Health, cluster: str) -> bytes:
    """One `lb_endpoints` entry (field 2 of LocalityLbEndpoints), encoded."""
    lb_endpoint = _lb_endpoint(address, port, health, cluster)
    return length_delimited(2, lb_endpoint.SerializeToString(deterministic=True))


def encode_load_assignment(
    cluster_name: str, port: ServicePort, endpoint_sets: Iterable[EndpointSet]
) -> bytes:
    """The assignment for one Service port, serialized; empty (not absent) with no endpoints."""
    by_zone: dict[str, list[bytes]] = {}
    hosts = sorted(collect_hosts(port, endpoint_sets).items())
    for (address, number), (health, zone, cluster) in hosts:
        by_zone.setdefault(zone, []).append(_encoded_lb_endpoint(address, number, health, cluster))
    parts = [length_delimited(1, cluster_name.encode())] if cluster_name else []
    for zone in sorted(by_zone):
        locality = length_delimited(1, length_delimited(2, zone.encode()) if zone else b"")
        parts.append(length_delimited(2, locality + b"".join(by_zone[zone])))
    return b"".join(parts)


def build_load_assignment(
    cluster_name: str, port: ServicePort, endpoint_sets: Iterable[EndpointSet]
) -> endpoint_pb2.ClusterLoadAssignment:
    """The same assignment as a message (for reading it: debug views, tests)."""
    return endpoint_pb2.ClusterLoadAssignment.FromString(
        encode_load_assignment(cluster_name, port, endpoint_sets)
    )
