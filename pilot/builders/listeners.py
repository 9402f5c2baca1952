"""A sidecar's outbound listeners, as pure functions: `virtualOutbound`, one listener per
address and port in each interception mode, and which service wins an address two claim.

The filters and chains here (`typed`, `socket_address`, `router_filter`,
`tcp_proxy_filter`) are the inbound side's too. The LDS generator
(`pilot.generators.lds`) keeps which services claim which addresses and calls these.
"""

from __future__ import annotations

import ipaddress

from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.listener.original_dst.v3 import original_dst_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from google.protobuf import any_pb2, wrappers_pb2
from google.protobuf.message import Message

from pilot.builders.outbound import (
    ANY_ADDRESS,
    BLACKHOLE_CLUSTER,
    LOCALHOST,
    VIRTUAL_OUTBOUND,
    OutboundSettings,
    listener_name,
)
from pilot.builders.path_normalization import PathNormalization, normalize_paths
from pilot.builders.proxy_ports import VIRTUAL_OUTBOUND_PORT
from pilot.registry.model import ServiceKey
from pilot.xds.interception import Interception

ListenerKey = tuple[Interception, str, int]  # mode, address, port
# Who claims one listener address: service -> (cluster name, whether the port is HTTP).
Claims = dict[ServiceKey, tuple[str, bool]]


def typed(message: Message) -> any_pb2.Any:
    """`message` packed as the `typed_config` of a filter or extension."""
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def socket_address(address: str, port: int) -> address_pb2.Address:
    return address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=address, port_value=port)
    )


def router_filter() -> hcm_pb2.HttpFilter:
    """The HTTP connection manager's last filter: route the request."""
    return hcm_pb2.HttpFilter(
        name="envoy.filters.http.router", typed_config=typed(router_pb2.Router())
    )


def route_filters() -> list[hcm_pb2.HttpFilter]:
    """CORS and fault injection, as Istio's outbound chain carries them: they do nothing
    but where a route's per-filter config (a VirtualService's) asks."""
    return [
        hcm_pb2.HttpFilter(name="envoy.filters.http.cors", typed_config=typed(cors_pb2.Cors())),
        hcm_pb2.HttpFilter(
            name="envoy.filters.http.fault", typed_config=typed(fault_pb2.HTTPFault())
        ),
    ]


# A VirtualService's tcp route: (cluster, weight) of each destination.
Weighted = tuple[tuple[str, int], ...]


def tcp_proxy_filter(
    stat_prefix: str, cluster: str, weighted: Weighted = ()
) -> listener_components_pb2.Filter:
    """The network filter that proxies every connection to `cluster`, or to `weighted`
    clusters (two or more) in proportion to their weights."""
    proxy = tcp_proxy_pb2.TcpProxy(stat_prefix=stat_prefix)
    if len(weighted) > 1:
        for name, weight in weighted:
            proxy.weighted_clusters.clusters.add(name=name, weight=weight)
    else:
        proxy.cluster = weighted[0][0] if weighted else cluster
    return listener_components_pb2.Filter(
        name="envoy.filters.network.tcp_proxy", typed_config=typed(proxy)
    )


def tcp_proxy_chain(
    stat_prefix: str, cluster: str, weighted: Weighted = ()
) -> listener_components_pb2.FilterChain:
    """A filter chain that proxies every connection to `cluster` (or `weighted`)."""
    return listener_components_pb2.FilterChain(
        filters=[tcp_proxy_filter(stat_prefix, cluster, weighted)]
    )


def http_chain(
    stat_prefix: str, port: int, normalization: PathNormalization = PathNormalization.BASE
) -> listener_components_pb2.FilterChain:
    """A filter chain whose HTTP connection manager reads route configuration `port` (ADS),
    paths normalized as istiod does for `normalization` (on outbound managers too)."""
    source = config_source_pb2.ConfigSource(resource_api_version=config_source_pb2.V3)
    source.ads.SetInParent()
    manager = hcm_pb2.HttpConnectionManager(
        stat_prefix=stat_prefix,
        rds=hcm_pb2.Rds(config_source=source, route_config_name=str(port)),
        http_filters=[*route_filters(), router_filter()],
    )
    normalize_paths(manager, normalization)
    return listener_components_pb2.FilterChain(
        filters=[
            listener_components_pb2.Filter(
                name="envoy.filters.network.http_connection_manager",
                typed_config=typed(manager),
            )
        ]
    )


def virtual_outbound_blackhole() -> listener_components_pb2.FilterChain:
    """A connection whose original destination is 15001 itself goes nowhere.

    Without it, a connection to a pod's 15001 from outside (virtualInbound passes
    it through to the pod's own 15001) is sent on by PassthroughCluster, captured
    again, and comes back: a loop that ends when Envoy runs out of descriptors.
    """
    chain = tcp_proxy_chain(BLACKHOLE_CLUSTER, BLACKHOLE_CLUSTER)
    chain.name = f"{VIRTUAL_OUTBOUND}-blackhole"
    chain.filter_chain_match.destination_port.value = VIRTUAL_OUTBOUND_PORT
    return chain


def virtual_outbound(settings: OutboundSettings) -> listener_pb2.Listener:
    """15001: where captured connections land, handed on by their original destination."""
    chain = tcp_proxy_chain(settings.fallback_cluster, settings.fallback_cluster)
    chain.name = settings.fallback_cluster
    return listener_pb2.Listener(
        name=VIRTUAL_OUTBOUND,
        address=socket_address(ANY_ADDRESS, VIRTUAL_OUTBOUND_PORT),
        use_original_dst=wrappers_pb2.BoolValue(value=True),
        traffic_direction=base_pb2.OUTBOUND,
        filter_chains=[virtual_outbound_blackhole(), chain],
        listener_filters=[
            listener_components_pb2.ListenerFilter(
                name="envoy.filters.listener.original_dst",
                typed_config=typed(original_dst_pb2.OriginalDst()),
            )
        ],
    )


def outbound_listener(
    mode: Interception,
    address: str,
    port: int,
    cluster: str,
    http: bool,
    *,
    weighted: Weighted = (),
    normalization: PathNormalization = PathNormalization.BASE,
) -> listener_pb2.Listener:
    """One outbound listener: HTTP by routes, or TCP to one cluster (or a VirtualService's
    tcp route's, `weighted`)."""
    name = listener_name(address, port)
    chain = (
        http_chain(f"outbound_{name}", port, normalization)
        if http
        else tcp_proxy_chain(cluster, cluster, weighted)
    )
    return listener_pb2.Listener(
        name=name,
        address=socket_address(address, port),
        # Captured traffic reaches it through virtualOutbound; in NONE mode it binds.
        bind_to_port=wrappers_pb2.BoolValue(value=mode is Interception.NONE),
        traffic_direction=base_pb2.OUTBOUND,
        filter_chains=[chain],
    )


def claimed_addresses(
    mode: Interception, cluster_ip: str, port: int, http: bool
) -> tuple[str, int] | None:
    """The address a service port claims in `mode` (None: no listener, a headless TCP port).

    A ClusterIP of 0.0.0.0 or :: counts as none: its TCP listener would be the
    wildcard, taking every captured connection on the port, whoever it was for.
    """
    if mode is Interception.NONE:
        return LOCALHOST, port
    if http:
        return ANY_ADDRESS, port
    if not cluster_ip or ipaddress.ip_address(cluster_ip).is_unspecified:
        return None
    return cluster_ip, port


def winner(claims: Claims) -> tuple[ServiceKey, str, bool]:
    """Of several services on one address: an HTTP one, else the first by namespace and name."""
    key = min(claims, key=lambda k: (not claims[k][1], k))
    cluster, http = claims[key]
    return key, cluster, http
