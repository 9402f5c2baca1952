"""What a sidecar's outbound listeners and routes are made of: Istio's names and its policy.

A Service port becomes, by its protocol (`pilot.builders.protocols`), either
an HTTP port P (a listener `0.0.0.0_P` whose connection manager reads the
route configuration `P`, one virtual host `HOST:P` per service there) or a TCP
port (a listener `CLUSTERIP_P` straight to the cluster; none for a headless
Service, as Istio). With `INTERCEPTION_MODE: NONE` every outbound listener
binds `127.0.0.1_P` instead, so services on one port share one listener:
HTTP wins over TCP there, and of two TCP services the first by namespace and
name (Istio keeps the listener it built first and counts the conflict).

Connections to nothing pilot knows go to `PassthroughCluster` (their original
destination) under `PILOT_OUTBOUND_TRAFFIC_POLICY=ALLOW_ANY`, Istio's default,
or to `BlackHoleCluster` under REGISTRY_ONLY.

A Service whose name or namespace is not a DNS label reaches no listener or
route: its names become Envoy domains and listener names, where a `*` or a
duplicate would make Envoy reject the whole route configuration. A Service
port that is one of the sidecar's own (`pilot.builders.proxy_ports`: 15000,
15001, 15006, 15020, 15021, 15090) gets no listener and no route in any mode,
as Istio skips ports that conflict with its reserved listeners: `0.0.0.0_15001`
beside `virtualOutbound` would make Envoy reject every listener of the update,
and `127.0.0.1_15000` (NONE mode) would bind over the admin API.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from envoy.config.cluster.v3 import cluster_pb2
from google.protobuf import duration_pb2

from pilot.builders.cds import CONNECT_TIMEOUT_SECONDS
from pilot.builders.istio_defaults import lift_circuit_breakers
from pilot.builders.protocols import PortProtocol, is_http, protocol_of
from pilot.builders.proxy_ports import reserved
from pilot.registry.model import Service, ServicePort

PASSTHROUGH_CLUSTER = "PassthroughCluster"
BLACKHOLE_CLUSTER = "BlackHoleCluster"
VIRTUAL_OUTBOUND = "virtualOutbound"
ANY_ADDRESS = "0.0.0.0"
LOCALHOST = "127.0.0.1"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class TrafficPolicy(StrEnum):
    """Istio's `outboundTrafficPolicy.mode`: where traffic to unknown destinations goes."""

    ALLOW_ANY = "ALLOW_ANY"
    REGISTRY_ONLY = "REGISTRY_ONLY"


@dataclass(frozen=True, slots=True)
class OutboundSettings:
    """What outbound listeners and routes depend on besides the registry."""

    traffic_policy: TrafficPolicy = TrafficPolicy.ALLOW_ANY
    # Route configuration flavors for sidecars whose routes depend on who they are
    # (PILOT_MAX_ROUTE_FLAVORS): a sidecar beyond it reads the shared routes.
    max_route_flavors: int = 256

    @property
    def fallback_cluster(self) -> str:
        """Where a connection to no known service goes."""
        if self.traffic_policy is TrafficPolicy.ALLOW_ANY:
            return PASSTHROUGH_CLUSTER
        return BLACKHOLE_CLUSTER


def listener_name(address: str, port: int) -> str:
    """Istio's outbound listener name: `ADDRESS_PORT`."""
    return f"{address}_{port}"


def routable(service: Service) -> bool:
    """Whether a service's names are safe as Envoy domains and listener names."""
    key = service.key
    return bool(_DNS_LABEL.fullmatch(key.name) and _DNS_LABEL.fullmatch(key.namespace))


def _proxied(port: ServicePort) -> bool:
    return protocol_of(port) is not PortProtocol.UDP


def outbound_ports(service: Service) -> list[tuple[ServicePort, bool]]:
    """The ports that get outbound listeners, each with whether it is HTTP."""
    if not routable(service):
        return []
    return [
        (port, is_http(port))
        for port in service.ports
        if _proxied(port) and not reserved(port.port)
    ]


def reserved_ports(service: Service) -> tuple[int, ...]:
    """The ports `outbound_ports` leaves out because the sidecar keeps them (sorted)."""
    if not routable(service):
        return ()
    return tuple(sorted({p.port for p in service.ports if _proxied(p) and reserved(p.port)}))


def fixed_clusters() -> list[cluster_pb2.Cluster]:
    """The clusters outbound listeners name beside services' own, as Istio sends them."""
    timeout = duration_pb2.Duration(seconds=CONNECT_TIMEOUT_SECONDS)
    passthrough = cluster_pb2.Cluster(
        name=PASSTHROUGH_CLUSTER,
        type=cluster_pb2.Cluster.ORIGINAL_DST,
        lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED,
        connect_timeout=timeout,
    )
    lift_circuit_breakers(passthrough)  # as Istio's; the blackhole keeps Envoy's
    blackhole = cluster_pb2.Cluster(
        name=BLACKHOLE_CLUSTER, type=cluster_pb2.Cluster.STATIC, connect_timeout=timeout
    )
    return [passthrough, blackhole]
