"""The sidecar's own ports (15000, 15001, 15006, 15020, 15021, 15090) in the builders.

What a user's Envoy would show: `virtualOutbound` sends a connection to 15001
itself to BlackHoleCluster (so a connection to a pod's 15001 cannot loop), and
a Service on one of those ports gets no outbound listener or route in any
interception mode (one of them beside `virtualOutbound` makes Envoy reject the
whole LDS update), told once, counted; its honest ports keep theirs. A workload
target port there gets no virtualInbound chain or inbound cluster. A TCP port
whose ClusterIP is the wildcard (0.0.0.0, ::) claims no listener on any port.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from pilot.builders.listeners import virtual_outbound
from pilot.builders.outbound import OutboundSettings, TrafficPolicy
from pilot.builders.settings import BuildSettings
from pilot.generators.lds import ListenerGenerator
from pilot.generators.rds import RouteGenerator
from pilot.push.request import PushRequest, RequestSink
from pilot.registry.index import EndpointIndex
from pilot.registry.model import Service, ServiceKey, ServicePort
from pilot.registry.updater import IndexUpdater
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.interception import Interception
from tests.unit.inbound_mesh import chains, endpoints, inbound_clusters, mesh, sidecar

OWN_PORTS = (15000, 15001, 15006, 15020, 15021, 15090)
HOSTILE = ServiceKey("shop", "hostile")


def _tcp_cluster(chain: listener_pb2.FilterChain) -> str:
    [network_filter] = chain.filters
    proxy = tcp_proxy_pb2.TcpProxy()
    network_filter.typed_config.Unpack(proxy)
    return proxy.cluster


@pytest.mark.parametrize("policy", list(TrafficPolicy))
def test_virtual_outbound_sends_a_connection_to_15001_itself_to_the_blackhole(
    policy: TrafficPolicy,
) -> None:
    listener = virtual_outbound(OutboundSettings(policy))
    to_itself = [
        chain
        for chain in listener.filter_chains
        if chain.filter_chain_match.destination_port.value == 15001
    ]
    assert [chain.name for chain in to_itself] == ["virtualOutbound-blackhole"]
    assert _tcp_cluster(to_itself[0]) == "BlackHoleCluster"
    [rest] = [chain for chain in listener.filter_chains if chain not in to_itself]
    assert not rest.HasField("filter_chain_match"), "everything else: the fallback"
    expected = "PassthroughCluster" if policy is TrafficPolicy.ALLOW_ANY else "BlackHoleCluster"
    assert _tcp_cluster(rest) == expected


@dataclass
class Outbound:
    index: EndpointIndex
    cache: ResourceCache
    stats: XdsStats
    updater: IndexUpdater
    listeners: ListenerGenerator
    routes: RouteGenerator
    pending: list[PushRequest]

    def push(self) -> None:
        request = PushRequest()
        for waiting in self.pending:
            request = request.merge(waiting)
        self.pending.clear()
        self.listeners.build(request)
        self.routes.build(request)

    def listener_names(self, mode: Interception) -> set[str]:
        return set(self.cache.names(types.LISTENER, flavor=mode.value))

    def route_names(self, mode: Interception) -> set[str]:
        return set(self.cache.names(types.ROUTE, flavor=mode.value))


@contextmanager
def outbound() -> Iterator[Outbound]:
    index, cache, stats = EndpointIndex(), ResourceCache(), XdsStats()
    build, settings = BuildSettings(), OutboundSettings()
    pending: list[PushRequest] = []
    yield Outbound(
        index,
        cache,
        stats,
        IndexUpdater(index, RequestSink(pending.append), stats),
        ListenerGenerator(index, cache, settings, build, stats),
        RouteGenerator(index, cache, settings, build, stats),
        pending,
    )


def hostile(cluster_ip: str = "10.96.0.66", extra: tuple[int, ...] = ()) -> Service:
    """HTTP and TCP ports on every one of the sidecar's own, and one honest port."""
    ports = [ServicePort(f"http-{p}", p) for p in OWN_PORTS[:3]]
    ports += [ServicePort(f"tcp-{p}", p) for p in OWN_PORTS[3:]]
    ports += [ServicePort(f"http-{p}", p) for p in (9080, *extra)]
    return Service(HOSTILE, tuple(ports), cluster_ip=cluster_ip)


def _own(names: set[str]) -> set[str]:
    return {name for name in names if name.rsplit("_", 1)[-1] in {str(p) for p in OWN_PORTS}}


def test_a_service_on_the_sidecars_own_ports_gets_no_listener_or_route_in_any_mode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with outbound() as o, caplog.at_level(logging.WARNING, "pilot.xds"):
        o.updater.upsert_service(hostile())
        o.push()
        redirect = o.listener_names(Interception.REDIRECT)
        assert _own(redirect) == set(), f"listeners on the sidecar's own ports: {redirect}"
        assert {"virtualOutbound", "0.0.0.0_9080"} <= redirect, "the honest port keeps its own"
        none = o.listener_names(Interception.NONE)
        assert _own(none) == set(), f"NONE mode binds over the sidecar's ports: {none}"
        assert "127.0.0.1_9080" in none
        for mode in Interception:
            assert o.route_names(mode) == {"9080"}, "routes: the honest HTTP port only"
        lines = [r.getMessage() for r in caplog.records if "shop/hostile" in r.getMessage()]
        assert len(lines) == 1, f"one warning naming the service, got {lines}"
        assert all(str(port) in lines[0] for port in OWN_PORTS), lines[0]
        assert o.stats.reserved_ports == len(OWN_PORTS)

        o.updater.upsert_service(hostile(extra=(9081,)))  # changed again, the same own ports
        o.push()
        assert "0.0.0.0_9081" in o.listener_names(Interception.REDIRECT)
        lines = [r.getMessage() for r in caplog.records if "shop/hostile" in r.getMessage()]
        assert len(lines) == 1, f"said once, not once per change: {lines}"
        assert o.stats.reserved_ports == len(OWN_PORTS), "counted once per port"


def test_a_wildcard_cluster_ip_cannot_put_a_tcp_listener_on_15001() -> None:
    """A TCP port's listener is CLUSTERIP_P: a ClusterIP 0.0.0.0 would be the wildcard."""
    with outbound() as o:
        o.updater.upsert_service(hostile(cluster_ip="0.0.0.0"))
        o.push()
        redirect = o.listener_names(Interception.REDIRECT)
        assert _own(redirect) == set(), f"listeners on the sidecar's own ports: {redirect}"


def test_reserved_target_ports_get_no_inbound_chain_or_cluster() -> None:
    with mesh() as m:
        ports = (("http", 9080), ("http-outbound", 9081), ("http-status", 9082))
        m.updater.upsert_service(
            Service(ServiceKey("shop", "app"), tuple(ServicePort(*p) for p in ports))
        )
        targets = (("http", 8080), ("http-outbound", 15001), ("http-status", 15021))
        m.updater.upsert_endpoints(endpoints("app", ["10.1.0.1"], *targets))
        m.flush()
        pod = m.connect(sidecar("10.1.0.1"))
        assert chains(pod) == [
            "virtualInbound-blackhole",
            "inbound|8080||-mtls",
            "inbound|8080||-plaintext",
            "virtualInbound-mtls",
            "virtualInbound",
        ], "no chain for the sidecar's own 15001 or 15021"
        assert inbound_clusters(pod) == {"inbound|8080||"}


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
def test_a_wildcard_cluster_ip_claims_no_tcp_listener_on_any_port(wildcard: str) -> None:
    """Its listener would take every captured connection on that port, to anyone."""
    with outbound() as o:
        ports = (ServicePort("tcp-db", 5432), ServicePort("http", 9080))
        o.updater.upsert_service(Service(HOSTILE, ports, cluster_ip=wildcard))
        o.push()
        redirect = o.listener_names(Interception.REDIRECT)
        assert {name for name in redirect if name.endswith("_5432")} == set(), redirect
        assert "0.0.0.0_9080" in redirect, "its HTTP port is routed by name, as before"
