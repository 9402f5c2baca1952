"""ClusterLoadAssignments: a Service port's endpoints, grouped by locality.

Endpoints are matched to the Service port by port name (the slice lists the
resolved targetPort under the Service port's name). Ready endpoints are
HEALTHY, serving-but-terminating ones DRAINING, others are left out. The same
address:port from several slices appears once, with its best health. Output is
sorted, so equal content serializes to equal bytes. Each endpoint carries the
id of the cluster it came from in its metadata (`istio` / `cluster_id`), so
Envoy's access logs (`%UPSTREAM_METADATA(istio:cluster_id)%`) tell them apart.
An endpoint whose pod runs a sidecar (`sidecar`: the index's answer for its
endpoint set, the endpoint and its address, which finds its pod by its
targetRef) carries `envoy.transport_socket_match: {tlsMode: istio}`,
as Istio puts it: a sidecar's cluster then picks its mTLS transport socket for
it (`pilot.builders.mtls`), and plaintext for the others.

An endpoint's locality (region, zone) comes from `locate` (the endpoint index
resolves it from the endpoint's Node; without one, only the slice's zone).
Each locality's group is placed as the cluster's locality rule says for the
calling proxy (`pilot.builders.locality_lb`): by default all in priority 0; with
failover, in priorities by proximity; with `distribute`, with locality weights.
The hosts are grouped once (`group_hosts`) and each proxy locality's variant is
encoded from the groups (`encode_groups`).

The assignment is encoded by hand from each endpoint's encoded `LbEndpoint`,
kept in a bounded cache: one endpoint of 5,000 changing re-encodes one, not
5,000 messages. The bytes are exactly protobuf's deterministic serialization
(a test holds them to it), so versions do not depend on which encoder ran.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2

from pilot.builders.locality_lb import FLAT, LocalityRule, placements
from pilot.registry.model import Endpoint, EndpointSet, EndpointSetKey, Health, ServicePort
from pilot.xds.locality import NOWHERE, Locality
from pilot.xds.resource import length_delimited, varint_field

ENCODED_ENDPOINTS = 1 << 16  # LbEndpoints kept encoded (~150 bytes each)

_HEALTH_STATUS = {
    Health.HEALTHY: health_check_pb2.HEALTHY,
    Health.DRAINING: health_check_pb2.DRAINING,
}
_PREFERENCE = {Health.HEALTHY: 0, Health.DRAINING: 1}

HostKey = tuple[str, int]
Host = tuple[Health, Locality, str, bool]  # health, where it is, cluster id, runs a sidecar
Locate = Callable[[str, Endpoint], Locality]  # (cluster id, endpoint) -> its locality
# (its endpoint set, the endpoint, an address of it) -> its pod runs a sidecar
Sidecar = Callable[[EndpointSetKey, Endpoint, str], bool]
METADATA_KEY = "istio"
CLUSTER_ID_FIELD = "cluster_id"
TRANSPORT_SOCKET_MATCH_KEY = "envoy.transport_socket_match"
TLS_MODE_FIELD = "tlsMode"
ISTIO_TLS_MODE = "istio"
_WEIGHT_FIELD = 3  # LocalityLbEndpoints.load_balancing_weight (a UInt32Value)
_PRIORITY_FIELD = 5  # LocalityLbEndpoints.priority


def zone_only(cluster: str, endpoint: Endpoint) -> Locality:
    """The locality an endpoint says itself (its slice's zone), for callers with no Nodes."""
    return _zone(endpoint.zone)


def no_sidecar(key: EndpointSetKey, endpoint: Endpoint, address: str) -> bool:
    """For callers that know no Pods: no endpoint runs a sidecar."""
    return False


@functools.lru_cache(maxsize=1024)
def _zone(zone: str) -> Locality:
    return Locality(zone=zone)


def collect_hosts(
    port: ServicePort,
    endpoint_sets: Iterable[EndpointSet],
    locate: Locate = zone_only,
    sidecar: Sidecar = no_sidecar,
) -> dict[HostKey, Host]:
    """address:port -> (health, locality, cluster, sidecar) for one Service port."""
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
                        where = locate(cluster, endpoint)
                        mtls = sidecar(endpoint_set.key, endpoint, address)
                        hosts[key] = (health, where, cluster, mtls)
    return hosts


def _lb_endpoint(
    address: str, port: int, health: Health, cluster: str, sidecar: bool = False
) -> endpoint_components_pb2.LbEndpoint:
    lb_endpoint = endpoint_components_pb2.LbEndpoint(health_status=_HEALTH_STATUS[health])
    socket_address = lb_endpoint.endpoint.address.socket_address
    socket_address.address = address
    socket_address.port_value = port
    if cluster:
        lb_endpoint.metadata.filter_metadata[METADATA_KEY][CLUSTER_ID_FIELD] = cluster
    if sidecar:
        match = lb_endpoint.metadata.filter_metadata[TRANSPORT_SOCKET_MATCH_KEY]
        match[TLS_MODE_FIELD] = ISTIO_TLS_MODE
    return lb_endpoint


@functools.lru_cache(maxsize=ENCODED_ENDPOINTS)
def _encoded_lb_endpoint(
    address: str, port: int, health: Health, cluster: str, sidecar: bool = False
) -> bytes:
    """One `lb_endpoints` entry (field 2 of LocalityLbEndpoints), encoded."""
    lb_endpoint = _lb_endpoint(address, port, health, cluster, sidecar)
    return length_delimited(2, lb_endpoint.SerializeToString(deterministic=True))


LocalityGroups = dict[Locality, list[bytes]]


def group_hosts(
    port: ServicePort,
    endpoint_sets: Iterable[EndpointSet],
    locate: Locate = zone_only,
    sidecar: Sidecar = no_sidecar,
) -> LocalityGroups:
    """One Service port's encoded `lb_endpoints` by locality: what every variant shares."""
    groups: LocalityGroups = {}
    for (address, number), (health, locality, cluster, mtls) in sorted(
        collect_hosts(port, endpoint_sets, locate, sidecar).items()
    ):
        encoded = _encoded_lb_endpoint(address, number, health, cluster, mtls)
        groups.setdefault(locality, []).append(encoded)
    return groups


def _encoded_locality(locality: Locality) -> bytes:
    fields = [length_delimited(1, locality.region.encode())] if locality.region else []
    if locality.zone:
        fields.append(length_delimited(2, locality.zone.encode()))
    return length_delimited(1, b"".join(fields))


def encode_groups(
    cluster_name: str,
    groups: LocalityGroups,
    proxy: Locality = NOWHERE,
    rule: LocalityRule = FLAT,
) -> bytes:
    """The assignment as a proxy in `proxy` gets it: localities placed by `rule`."""
    placed = placements(rule, proxy, {locality: len(hosts) for locality, hosts in groups.items()})
    parts = [length_delimited(1, cluster_name.encode())] if cluster_name else []
    for locality in sorted(groups):
        place = placed[locality]
        body = _encoded_locality(locality)
        if not place.dropped:
            body += b"".join(groups[locality])
        if place.weight is not None:
            body += length_delimited(_WEIGHT_FIELD, varint_field(1, place.weight))
        if place.priority:
            body += varint_field(_PRIORITY_FIELD, place.priority)
        parts.append(length_delimited(2, body))
    return b"".join(parts)


def encode_load_assignment(
    cluster_name: str,
    port: ServicePort,
    endpoint_sets: Iterable[EndpointSet],
    *,
    proxy: Locality = NOWHERE,
    locate: Locate = zone_only,
    rule: LocalityRule = FLAT,
) -> bytes:
    """The assignment for one Service port, serialized; empty (not absent) with no endpoints."""
    groups = group_hosts(port, endpoint_sets, locate)
    return encode_groups(cluster_name, groups, proxy, rule)


def build_load_assignment(
    cluster_name: str,
    port: ServicePort,
    endpoint_sets: Iterable[EndpointSet],
    *,
    proxy: Locality = NOWHERE,
    locate: Locate = zone_only,
    rule: LocalityRule = FLAT,
) -> endpoint_pb2.ClusterLoadAssignment:
    """The same assignment as a message (for reading it: debug views, tests)."""
    return endpoint_pb2.ClusterLoadAssignment.FromString(
        encode_load_assignment(
            cluster_name, port, endpoint_sets, proxy=proxy, locate=locate, rule=rule
        )
    )
