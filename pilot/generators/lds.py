"""LDS: a sidecar's outbound listeners, one flavor per interception mode, rebuilt per address.

Listeners depend on services and their ports only, never on endpoints: an
endpoint change builds nothing here. Each service claims listener addresses
(`ListenerKey`: address and port, per mode); a full change of a service
rebuilds only the addresses it claimed before or claims now, each listener
serialized once per mode, and shared by every proxy of that mode.
`virtualOutbound` (REDIRECT mode only) depends on the traffic policy alone; its
first chain sends a connection to 15001 itself to `BlackHoleCluster` (Istio's
`virtualOutbound-blackhole`), so nothing loops through it.

A service port on one of the sidecar's own ports (`pilot.generators.proxy_ports`)
claims no address in any mode (`outbound_ports` leaves it out): the operator
hears it once per service (a warning naming it and the ports, at most
MAX_CONFLICTS_LOGGED services at a time) and `pilot_reserved_ports` counts it.
A TCP port's listener is its ClusterIP's; a ClusterIP of 0.0.0.0 or :: gets
none, as a headless Service's (it would be the wildcard: every destination).
"""

from __future__ import annotations

import ipaddress
import logging

from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.listener.original_dst.v3 import original_dst_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from google.protobuf import any_pb2, wrappers_pb2
from google.protobuf.message import Message

from pilot.generators.builder import BuildSettings
from pilot.generators.naming import outbound_cluster_name
from pilot.generators.outbound import (
    ANY_ADDRESS,
    BLACKHOLE_CLUSTER,
    LOCALHOST,
    VIRTUAL_OUTBOUND,
    OutboundSettings,
    listener_name,
    outbound_ports,
    reserved_ports,
)
from pilot.generators.proxy_ports import RESERVED_PORTS, VIRTUAL_OUTBOUND_PORT
from pilot.logs import clipped
from pilot.push.request import Changes, PushRequest
from pilot.registry.index import EndpointIndex
from pilot.registry.model import ServiceKey
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.interception import Interception
from pilot.xds.resource import Resource

log = logging.getLogger("pilot.xds")

ListenerKey = tuple[Interception, str, int]  # mode, address, port
# Who claims one listener address: service -> (cluster name, whether the port is HTTP).
Claims = dict[ServiceKey, tuple[str, bool]]
MAX_CONFLICTS_LOGGED = 16


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


def tcp_proxy_filter(stat_prefix: str, cluster: str) -> listener_components_pb2.Filter:
    """The network filter that proxies every connection to `cluster`."""
    proxy = tcp_proxy_pb2.TcpProxy(stat_prefix=stat_prefix, cluster=cluster)
    return listener_components_pb2.Filter(
        name="envoy.filters.network.tcp_proxy", typed_config=typed(proxy)
    )


def tcp_proxy_chain(stat_prefix: str, cluster: str) -> listener_components_pb2.FilterChain:
    """A filter chain that proxies every connection to `cluster`."""
    return listener_components_pb2.FilterChain(filters=[tcp_proxy_filter(stat_prefix, cluster)])


def http_chain(stat_prefix: str, port: int) -> listener_components_pb2.FilterChain:
    """A filter chain whose HTTP connection manager reads route configuration `port` (ADS)."""
    source = config_source_pb2.ConfigSource(resource_api_version=config_source_pb2.V3)
    source.ads.SetInParent()
    manager = hcm_pb2.HttpConnectionManager(
        stat_prefix=stat_prefix,
        rds=hcm_pb2.Rds(config_source=source, route_config_name=str(port)),
        http_filters=[router_filter()],
    )
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
    mode: Interception, address: str, port: int, cluster: str, http: bool
) -> listener_pb2.Listener:
    """One outbound listener: HTTP by routes, or TCP to one cluster."""
    name = listener_name(address, port)
    chain = http_chain(f"outbound_{name}", port) if http else tcp_proxy_chain(cluster, cluster)
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


class ListenerGenerator:
    """The LDS generator: services' ports in, listeners per interception mode out."""

    type_urls = frozenset({types.LISTENER})

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
        self._claims: dict[ListenerKey, Claims] = {}
        self._claimed: dict[ServiceKey, set[ListenerKey]] = {}
        self._conflicts: set[ListenerKey] = set()  # logged once each
        # Services with ports the sidecar keeps for itself: those ports, refused now.
        self._reserved: dict[ServiceKey, tuple[int, ...]] = {}
        self._reserved_logged: set[ServiceKey] = set()
        self._started = False

    def build(self, request: PushRequest) -> Changes:
        """Rebuild the listeners of the addresses the changed services claim(ed)."""
        changed: set[str] = set()
        if not self._started:
            self._started = True
            resource = Resource.from_message(
                types.LISTENER, VIRTUAL_OUTBOUND, virtual_outbound(self._settings)
            )
            self._store(Interception.REDIRECT, [resource], [])
            changed.add(VIRTUAL_OUTBOUND)
        affected: set[ListenerKey] = set()
        for key in sorted(request.registry.full):
            affected |= self._reclaim(key)
        changed |= self._rebuild(affected)
        return Changes(shared={types.LISTENER: changed}) if changed else Changes()

    def _reclaim(self, key: ServiceKey) -> set[ListenerKey]:
        """Move a service's claims to what it has now; returns every address touched."""
        old = self._claimed.pop(key, set())
        for listener in old:
            self._claims[listener].pop(key, None)
        new: set[ListenerKey] = set()
        service = self._index.services.get(key)
        self._note_reserved(key, reserved_ports(service) if service is not None else ())
        cluster_ip = service.cluster_ip if service is not None else ""
        for port, http in outbound_ports(service) if service is not None else []:
            cluster = outbound_cluster_name(key, port, self._domain)
            for mode in Interception:
                address = claimed_addresses(mode, cluster_ip, port.port, http)
                if address is not None:
                    listener = (mode, *address)
                    self._claims.setdefault(listener, {}).setdefault(key, (cluster, http))
                    new.add(listener)
        if new:
            self._claimed[key] = new
        return old | new

    def _rebuild(self, affected: set[ListenerKey]) -> set[str]:
        changed: set[str] = set()
        for mode in Interception:
            built, gone = [], []
            for listener in sorted(k for k in affected if k[0] is mode):
                _, address, port = listener
                claims = self._claims.get(listener)
                if not claims:
                    self._claims.pop(listener, None)
                    self._conflicts.discard(listener)
                    gone.append(listener_name(address, port))
                    continue
                _, cluster, http = winner(claims)
                self._note_conflict(listener, claims)
                message = outbound_listener(mode, address, port, cluster, http)
                built.append(Resource.from_message(types.LISTENER, message.name, message))
            changed |= self._store(mode, built, gone)
        return changed

    def _store(self, mode: Interception, built: list[Resource], gone: list[str]) -> set[str]:
        if built:
            self._stats.serializations[types.LISTENER] += len(built)
        return self._cache.update(types.LISTENER, built, gone, flavor=mode.value)

    def _note_reserved(self, key: ServiceKey, ports: tuple[int, ...]) -> None:
        """A service on the sidecar's own ports gets no listener there: counted, said once."""
        before = self._reserved.pop(key, ())
        if not ports:
            self._reserved_logged.discard(key)
            return
        self._reserved[key] = ports
        refused = len(set(ports) - set(before))
        if not refused:
            return
        self._stats.reserved_ports += refused
        if len(self._reserved_logged) >= MAX_CONFLICTS_LOGGED:
            return
        self._reserved_logged.add(key)
        log.warning(
            "service %s: port(s) %s are the sidecar's own (Envoy's and the agent's %s);"
            " no outbound listener or route for them",
            clipped(str(key)),
            ", ".join(map(str, ports)),
            ", ".join(map(str, sorted(RESERVED_PORTS))),
        )

    def _note_conflict(self, listener: ListenerKey, claims: Claims) -> None:
        """A TCP service shares its listener address: one wins, the operator hears it once.

        (HTTP services sharing a port is no conflict: their routes tell them apart.)
        """
        tcp = sum(1 for _, http in claims.values() if not http)
        if len(claims) < 2 or not tcp or listener in self._conflicts:
            return
        if len(self._conflicts) >= MAX_CONFLICTS_LOGGED:
            return
        self._conflicts.add(listener)
        mode, address, port = listener
        key, _, http = winner(claims)
        log.warning(
            "%d services share the outbound listener %s (%s mode): %s (%s) gets it,"
            " the others are reached by routes only or not at all",
            len(claims),
            listener_name(address, port),
            mode.value,
            key,
            "HTTP" if http else "TCP",
        )
