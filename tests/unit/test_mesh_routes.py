"""Route configuration 9080 as the RDS generator builds it with VirtualServices held:
the one a sidecar follows per host (the oldest of two, mesh only, exported to all),
short and other-namespace destinations named as istiod names them, and a weight
change that changes route configuration 9080 and no cluster."""

from __future__ import annotations

from typing import Any

from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from pilot.builders.outbound import OutboundSettings, TrafficPolicy
from pilot.builders.settings import BuildSettings
from pilot.generators.cds import ClusterGenerator
from pilot.generators.lds import ListenerGenerator
from pilot.generators.rds import RouteGenerator
from pilot.push.request import PushRequest, RequestSink
from pilot.registry.index import EndpointIndex
from pilot.registry.model import ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.registry.updater import IndexUpdater
from pilot.registry.virtual_service import parse_virtual_service
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.interception import Interception
from tests.unit.inbound_mesh import svc

REVIEWS = "reviews.shop.svc.cluster.local"


def vs(name: str, spec: dict[str, Any], created: str = "2026-01-01T00:00:00Z", **meta: str) -> Any:
    obj = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": name, "namespace": "shop", "creationTimestamp": created} | meta,
        "spec": spec,
    }
    return parse_virtual_service(obj, "cluster.local")


def to(host: str, subset: str = "", weight: int = 0, port: int = 0) -> dict[str, Any]:
    destination: dict[str, Any] = {"host": host} | ({"subset": subset} if subset else {})
    if port:
        destination["port"] = {"number": port}
    return {"destination": destination} | ({"weight": weight} if weight else {})


class Mesh:
    """reviews and ratings on 9080 (ratings also on 9090), the RDS and CDS generators."""

    def __init__(self) -> None:
        self.index, self.cache, stats = EndpointIndex(), ResourceCache(), XdsStats()
        self.pending: list[PushRequest] = []
        self.traffic = TrafficConfig()
        self.updater = IndexUpdater(
            self.index, RequestSink(self.pending.append), stats, traffic=self.traffic
        )
        self.routes = RouteGenerator(
            self.index,
            self.cache,
            OutboundSettings(TrafficPolicy.ALLOW_ANY),
            BuildSettings(),
            stats,
            traffic=self.traffic,
        )
        self.clusters = ClusterGenerator(
            self.index, self.cache, BuildSettings(), stats, self.traffic
        )
        self.updater.upsert_service(svc("reviews", ("http", 9080)))
        self.updater.upsert_service(svc("ratings", ("http", 9080), ("http-b", 9090)))
        self.push()

    def push(self) -> tuple[set[str], set[str]]:
        """Build what waits; the route and cluster names that changed."""
        request = PushRequest()
        for waiting in self.pending:
            request = request.merge(waiting)
        self.pending.clear()
        routes = self.routes.build(request).shared.get(types.ROUTE, set())
        clusters = self.clusters.build(request).shared.get(types.CLUSTER, set())
        return routes, clusters

    def host(self, name: str) -> rc_pb2.VirtualHost:
        resource = self.cache.get(types.ROUTE, "9080", flavor=Interception.REDIRECT.value)
        assert resource is not None
        config = route_pb2.RouteConfiguration.FromString(resource.payload)
        return next(h for h in config.virtual_hosts if h.name == f"{name}:9080")


def test_a_virtual_service_replaces_the_default_route_of_its_host_only() -> None:
    mesh = Mesh()
    mesh.updater.upsert_config(
        vs("reviews", {"hosts": ["reviews"], "http": [{"route": [to("reviews", "v1")]}]})
    )
    mesh.push()
    [route] = mesh.host(REVIEWS).routes
    assert route.route.cluster == f"outbound|9080|v1|{REVIEWS}"
    [default] = mesh.host("ratings.shop.svc.cluster.local").routes
    assert default.name == "default"


def test_destination_ports_as_istiod_names_them() -> None:
    mesh = Mesh()
    spec = {
        "hosts": ["reviews"],
        "http": [
            {"match": [{"uri": {"prefix": "/a"}}], "route": [to("ratings")]},
            {"match": [{"uri": {"prefix": "/b"}}], "route": [to("ratings", port=9090)]},
            {"route": [to("details.other.svc.cluster.local", "v9")]},
        ],
    }
    mesh.updater.upsert_config(vs("reviews", spec))
    mesh.push()
    clusters = [r.route.cluster for r in mesh.host(REVIEWS).routes]
    ratings = "ratings.shop.svc.cluster.local"
    # ratings has two ports: the route configuration's; an unknown service: likewise.
    assert clusters == [
        f"outbound|9080||{ratings}",
        f"outbound|9090||{ratings}",
        "outbound|9080|v9|details.other.svc.cluster.local",
    ]


def test_the_oldest_of_two_for_one_host_wins_and_gateway_or_private_ones_route_nothing() -> None:
    mesh = Mesh()
    mesh.updater.upsert_config(
        vs("newer", {"hosts": ["reviews"], "http": [{"route": [to("reviews", "v3")]}]},
           created="2026-02-01T00:00:00Z")
    )  # fmt: skip
    mesh.updater.upsert_config(
        vs("older", {"hosts": ["reviews"], "http": [{"route": [to("reviews", "v1")]}]})
    )
    mesh.updater.upsert_config(
        vs("gateway", {"hosts": ["ratings"], "gateways": ["shop-gateway"],
                       "http": [{"route": [to("ratings", "v1")]}]})
    )  # fmt: skip
    mesh.updater.upsert_config(
        vs("private", {"hosts": ["ratings"], "exportTo": ["."],
                       "http": [{"route": [to("ratings", "v2")]}]})
    )  # fmt: skip
    mesh.push()
    [route] = mesh.host(REVIEWS).routes
    assert route.route.cluster == f"outbound|9080|v1|{REVIEWS}"
    [default] = mesh.host("ratings.shop.svc.cluster.local").routes
    assert default.name == "default"


def test_a_weight_change_changes_route_9080_and_no_cluster() -> None:
    mesh = Mesh()
    shift = {
        "hosts": ["reviews"],
        "http": [{"route": [to("reviews", "v1", 50), to("reviews", "v3", 50)]}],
    }
    mesh.updater.upsert_config(vs("reviews", shift))
    mesh.push()
    shift["http"][0]["route"][1]["weight"] = 20
    shift["http"][0]["route"][0]["weight"] = 80
    mesh.updater.upsert_config(vs("reviews", shift))
    routes, clusters = mesh.push()
    assert routes == {"9080"}
    assert clusters == set()
    weights = [
        c.weight.value for c in mesh.host(REVIEWS).routes[0].route.weighted_clusters.clusters
    ]
    assert weights == [80, 20]


def test_deleting_the_virtual_service_brings_the_default_route_back() -> None:
    mesh = Mesh()
    config = vs("reviews", {"hosts": ["reviews"], "http": [{"route": [to("reviews", "v1")]}]})
    mesh.updater.upsert_config(config)
    mesh.push()
    mesh.updater.delete_config(config.key)
    routes, _ = mesh.push()
    assert routes == {"9080"}
    assert [r.name for r in mesh.host(REVIEWS).routes] == ["default"]


def test_a_virtual_service_change_asks_for_routes_alone() -> None:
    """Its hosts' services come as `routes` (RDS rebuilds them), never as a full change
    (which would rebuild their clusters and assignments too)."""
    mesh = Mesh()
    mesh.updater.upsert_config(
        vs("reviews", {"hosts": ["reviews"], "http": [{"route": [to("reviews", "v1")]}]})
    )
    [request] = mesh.pending
    assert request.routes == {ServiceKey("shop", "reviews")}
    assert not request.registry


def _tcp_proxy(cache: ResourceCache, name: str) -> tcp_proxy_pb2.TcpProxy:
    resource = cache.get(types.LISTENER, name, flavor=Interception.REDIRECT.value)
    assert resource is not None, f"no listener {name}"
    listener = listener_pb2.Listener.FromString(resource.payload)
    proxy = tcp_proxy_pb2.TcpProxy()
    assert listener.filter_chains[0].filters[0].typed_config.Unpack(proxy)
    return proxy


def test_a_tcp_route_weighs_the_tcp_proxys_clusters_and_a_shift_moves_that_listener_alone() -> None:
    """istio.io's TCP traffic shifting: tcp-echo 80/20 over v1 and v2."""
    index, cache, stats = EndpointIndex(), ResourceCache(), XdsStats()
    pending: list[PushRequest] = []
    traffic = TrafficConfig()
    updater = IndexUpdater(index, RequestSink(pending.append), stats, traffic=traffic)
    listeners = ListenerGenerator(
        index, cache, OutboundSettings(TrafficPolicy.ALLOW_ANY), BuildSettings(), stats,
        traffic=traffic,
    )  # fmt: skip
    updater.upsert_service(svc("tcp-echo", ("tcp", 9000)))
    updater.upsert_service(svc("db", ("tcp", 5432)))

    def push() -> set[str]:
        request = PushRequest()
        for waiting in pending:
            request = request.merge(waiting)
        pending.clear()
        return listeners.build(request).shared.get(types.LISTENER, set())

    push()
    echo = "tcp-echo.shop.svc.cluster.local"
    name = "10.96.0.8_9000"  # svc() gives the ClusterIP 10.96.0.<len(name)>
    assert _tcp_proxy(cache, name).cluster == f"outbound|9000||{echo}"

    def shift(v1: int, v2: int) -> Any:
        spec = {
            "hosts": ["tcp-echo"],
            "tcp": [{"match": [{"port": 9000}],
                     "route": [to("tcp-echo", "v1", v1), to("tcp-echo", "v2", v2)]}],
        }  # fmt: skip
        return vs("tcp-echo", spec)

    both_modes = {name, "127.0.0.1_9000"}  # captured, and INTERCEPTION_MODE NONE's
    updater.upsert_config(shift(80, 20))
    assert push() == both_modes
    weighted = _tcp_proxy(cache, name).weighted_clusters.clusters
    assert [(c.name, c.weight) for c in weighted] == [
        (f"outbound|9000|v1|{echo}", 80),
        (f"outbound|9000|v2|{echo}", 20),
    ]
    updater.upsert_config(shift(50, 50))
    assert push() == both_modes  # db's listeners are not among them


def test_another_namespaces_virtual_service_cannot_take_over_a_services_routes() -> None:
    """Takeover: `evil` writes an older VirtualService for shop's reviews that mirrors its
    traffic away; sidecars keep shop's own routes. The root namespace's is taken."""
    mesh = Mesh()
    steal = {
        "hosts": [REVIEWS],
        "http": [
            {"route": [to("reviews", "v1")], "mirror": {"host": "thief.evil.svc.cluster.local"}}
        ],
    }
    mesh.updater.upsert_config(vs("steal", steal, created="2020-01-01T00:00:00Z", namespace="evil"))
    wild = {"hosts": ["*.shop.svc.cluster.local"], "http": [{"route": [to("ratings", "v9")]}]}
    mesh.updater.upsert_config(vs("wild", wild, namespace="evil"))
    mesh.push()
    [default] = mesh.host(REVIEWS).routes
    assert default.name == "default" and not default.route.request_mirror_policies
    mesh.updater.upsert_config(vs("mesh-wide", steal | {"http": [{"route": [to(REVIEWS, "v3")]}]},
                                  namespace="istio-system"))  # fmt: skip
    mesh.push()
    [route] = mesh.host(REVIEWS).routes
    assert route.route.cluster == f"outbound|9080|v3|{REVIEWS}"
