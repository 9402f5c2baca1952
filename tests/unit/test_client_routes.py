"""Route configurations that depend on the client, as the RDS generator builds them: which
VirtualServices a sidecar of each namespace follows (exportTo, Istio's precedence, another
namespace's host), `sourceNamespace` and `sourceLabels` matches, the flavors built once
and shared, moved when a Pod is relabelled and dropped with their last sidecar, and the
shared configuration left as it was."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.config.route.v3 import route_pb2

from pilot.builders.outbound import OutboundSettings, TrafficPolicy
from pilot.builders.settings import BuildSettings
from pilot.generators.rds import RouteGenerator
from pilot.push.request import Changes, PendingPush, RequestSink
from pilot.registry.index import EndpointIndex
from pilot.registry.model import Pod, PodKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.registry.updater import IndexUpdater
from pilot.registry.virtual_service import parse_virtual_service
from pilot.security.identity import Identity
from pilot.settings import SettingsError, outbound_from_env
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.interception import Interception
from pilot.xds.proxy import ProxyKey
from tests.unit.inbound_mesh import svc

REVIEWS = "reviews.shop.svc.cluster.local"
REDIRECT = Interception.REDIRECT


def vs(
    name: str, spec: dict[str, Any], namespace: str = "shop", created: str = "2026-01-01T00:00:00Z"
) -> Any:
    obj = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
        "spec": spec,
    }
    return parse_virtual_service(obj, "cluster.local")


def to(subset: str, host: str = REVIEWS) -> dict[str, Any]:
    return {"destination": {"host": host, "subset": subset}}


def sidecar(ip: str, namespace: str, account: str = "app", claimed: str = "") -> ProxyKey:
    """A sidecar's key: its node id (claiming `claimed` or its own namespace) and the
    identity it proved."""
    node = f"sidecar~{ip}~pod.{claimed or namespace}~{claimed or namespace}.svc.cluster.local"
    return ProxyKey(node, Identity("cluster.local", namespace, account).uri)


class Mesh:
    """reviews (shop) and ratings (front) on 9080, the RDS generator, pods by hand."""

    def __init__(self, max_flavors: int = 1000) -> None:
        self.index, self.cache, stats = EndpointIndex(), ResourceCache(), XdsStats()
        self.pending = PendingPush()
        self.updater = IndexUpdater(
            self.index, RequestSink(self.pending.add), stats, traffic=TrafficConfig()
        )
        self.routes = RouteGenerator(
            self.index,
            self.cache,
            OutboundSettings(TrafficPolicy.ALLOW_ANY, max_route_flavors=max_flavors),
            BuildSettings(),
            stats,
            traffic=self.updater.traffic,
        )
        self.updater.upsert_service(svc("reviews", ("http", 9080)))
        self.updater.upsert_service(svc("ratings", ("http", 9080), namespace="front"))
        self.push()

    def push(self) -> Changes:
        request = self.pending.take()
        return self.routes.build(request)

    def pod(self, ip: str, namespace: str, account: str = "app", **labels: str) -> None:
        key = PodKey("", namespace, f"pod-{ip}")
        pairs = tuple(sorted(labels.items()))
        self.updater.upsert_pod(Pod(key, (ip,), account, phase="Running", labels=pairs))

    def config(self, proxy: ProxyKey | None = None) -> route_pb2.RouteConfiguration:
        resource = self.cache.view({types.ROUTE: REDIRECT.value}, proxy).get(types.ROUTE, "9080")
        assert resource is not None
        return route_pb2.RouteConfiguration.FromString(resource.payload)

    def reviews(self, proxy: ProxyKey | None = None) -> list[rc_pb2.Route]:
        config = self.config(proxy)
        return list(next(h for h in config.virtual_hosts if h.name == f"{REVIEWS}:9080").routes)

    def subsets(self, proxy: ProxyKey | None = None) -> list[str]:
        return [r.route.cluster.split("|")[2] or "-" for r in self.reviews(proxy)]


def test_a_virtual_service_exported_to_its_own_namespace_routes_its_sidecars_alone() -> None:
    mesh = Mesh()
    before = mesh.config().SerializeToString()
    mesh.updater.upsert_config(
        vs("private", {"hosts": ["reviews"], "exportTo": ["."], "http": [{"route": [to("v2")]}]})
    )
    mesh.push()
    shop, front = sidecar("10.0.0.1", "shop"), sidecar("10.0.0.2", "front")
    for proxy in (shop, front):
        mesh.routes.client_joined(proxy, REDIRECT)
    assert mesh.subsets(shop) == ["v2"]
    assert mesh.subsets(front) == ["-"]  # the default route
    assert mesh.config().SerializeToString() == before  # the shared bytes, unchanged

    # Every other virtual host of shop's flavor is the shared one, byte for byte.
    def others(config: route_pb2.RouteConfiguration) -> list[bytes]:
        return [h.SerializeToString() for h in config.virtual_hosts if REVIEWS not in h.name]

    assert others(mesh.config(shop)) == others(mesh.config())
    assert len(others(mesh.config())) == 2  # ratings, and the fallback host
    assert mesh.routes.flavors == 1


def test_private_ones_come_first_then_exported_to_the_namespace_then_public() -> None:
    mesh = Mesh()
    older = "2025-01-01T00:00:00Z"
    mesh.updater.upsert_config(
        vs("public", {"hosts": ["reviews"], "http": [{"route": [to("v1")]}]}, created=older)
    )
    exported = {"hosts": ["reviews"], "exportTo": ["front"], "http": [{"route": [to("v3")]}]}
    mesh.updater.upsert_config(vs("to-front", exported))
    private = {"hosts": [REVIEWS], "exportTo": ["."], "http": [{"route": [to("v2")]}]}
    mesh.updater.upsert_config(vs("own", private, namespace="front"))
    mesh.push()
    front, other, shop = (
        sidecar("10.0.0.2", "front"),
        sidecar("10.0.0.3", "other"),
        sidecar("10.0.0.4", "shop"),
    )
    for proxy in (front, other, shop):
        mesh.routes.client_joined(proxy, REDIRECT)
    assert mesh.subsets(front) == ["v2"]  # its own namespace's private one
    assert mesh.subsets(other) == ["v1"]  # the public one, as everyone else
    assert mesh.subsets(shop) == ["v1"]  # exported to front only: not shop's own
    mesh.updater.delete_config(private_key := vs("own", private, namespace="front").key)
    assert private_key.namespace == "front"
    moved = mesh.push()
    assert moved.owned == {front: {types.ROUTE: {"9080"}}}
    assert mesh.subsets(front) == ["v3"]  # then what shop exports to front
    assert mesh.routes.flavors == 1


def test_a_virtual_service_for_another_namespaces_host_routes_its_own_sidecars_only() -> None:
    mesh = Mesh()
    mesh.updater.upsert_config(
        vs("steal", {"hosts": [REVIEWS], "http": [{"route": [to("v3")]}]}, namespace="front")
    )
    mesh.push()
    front, shop, other = (
        sidecar("10.0.0.2", "front"),
        sidecar("10.0.0.4", "shop"),
        sidecar("10.0.0.3", "other"),
    )
    for proxy in (front, shop, other):
        mesh.routes.client_joined(proxy, REDIRECT)
    assert mesh.subsets(front) == ["v3"]
    assert mesh.subsets(shop) == mesh.subsets(other) == mesh.subsets() == ["-"]


def test_source_namespace_and_source_labels_select_their_clients() -> None:
    mesh = Mesh()
    spec = {
        "hosts": ["reviews"],
        "http": [
            {"match": [{"sourceNamespace": "front"}], "route": [to("v2")]},
            {"match": [{"sourceLabels": {"app": "tester"}}], "route": [to("v3")]},
            {"route": [to("v1")]},
        ],
    }
    mesh.updater.upsert_config(vs("reviews", spec))
    mesh.pod("10.0.0.2", "front")
    mesh.pod("10.0.0.5", "shop", app="tester", version="a")
    mesh.pod("10.0.0.6", "shop", app="tester", version="b")
    mesh.pod("10.0.0.7", "shop", app="web")
    mesh.push()
    front, tester_a, tester_b, web = (
        sidecar("10.0.0.2", "front"),
        sidecar("10.0.0.5", "shop"),
        sidecar("10.0.0.6", "shop"),
        sidecar("10.0.0.7", "shop"),
    )
    for proxy in (front, tester_a, tester_b, web):
        mesh.routes.client_joined(proxy, REDIRECT)
    assert mesh.subsets() == ["v1"]  # shared: no source-dependent match
    assert mesh.subsets(front) == ["v2", "v1"]
    assert mesh.subsets(tester_a) == mesh.subsets(tester_b) == ["v3", "v1"]
    assert mesh.subsets(web) == ["v1"]
    # One flavor for front, one for the pods carrying app=tester (whatever else they carry).
    assert mesh.routes.flavors == 2

    # tester_b relabelled: it moves to the shared routes, one change to it alone.
    mesh.pod("10.0.0.6", "shop", app="web")
    moved = mesh.push()
    assert moved.owned == {tester_b: {types.ROUTE: {"9080"}}}
    assert not moved.shared
    assert mesh.subsets(tester_b) == ["v1"]
    assert mesh.routes.flavors == 2

    # The last readers leave: their flavors go with them.
    for proxy in (front, tester_a):
        mesh.routes.client_left(proxy)
    assert mesh.routes.flavors == 0
    assert not mesh.cache.names(types.ROUTE, flavor="routes#1")


def test_a_pod_not_its_own_or_unknown_gives_no_labels_and_a_claim_gives_nothing() -> None:
    mesh = Mesh()
    spec = {
        "hosts": ["reviews"],
        "http": [
            {"match": [{"sourceLabels": {"app": "tester"}}], "route": [to("v3")]},
            {"match": [{"sourceNamespace": "front"}], "route": [to("v2")]},
            {"route": [to("v1")]},
        ],
    }
    mesh.updater.upsert_config(vs("reviews", spec))
    mesh.pod("10.0.0.5", "shop", account="tester", app="tester")
    mesh.push()
    # Another account at the tester's IP: not its Pod. No identity: shared routes.
    impostor = sidecar("10.0.0.5", "shop", account="web")
    unproven = ProxyKey("sidecar~10.0.0.2~pod.front~front.svc.cluster.local", None)
    # Claims namespace front in its node id, proved shop.
    claimer = sidecar("10.0.0.8", "shop", claimed="front")
    unknown = sidecar("10.0.0.9", "shop", account="tester")  # no Pod at its IP
    for proxy in (impostor, unproven, claimer, unknown):
        mesh.routes.client_joined(proxy, REDIRECT)
    for proxy in (impostor, unproven, claimer, unknown):
        assert mesh.subsets(proxy) == ["v1"], proxy
    assert mesh.routes.flavors == 0
    # Its Pod arrives: it moves to the tester flavor.
    mesh.pod("10.0.0.9", "shop", account="tester", app="tester")
    moved = mesh.push()
    assert moved.owned == {unknown: {types.ROUTE: {"9080"}}}
    assert mesh.subsets(unknown) == ["v3", "v1"]


def test_nothing_client_dependent_makes_no_flavor_and_changes_go_to_readers() -> None:
    mesh = Mesh()
    mesh.updater.upsert_config(
        vs("reviews", {"hosts": ["reviews"], "http": [{"route": [to("v1")]}]})
    )
    mesh.push()
    shop = sidecar("10.0.0.4", "shop")
    mesh.routes.client_joined(shop, REDIRECT)
    assert mesh.routes.flavors == 0
    # A private one in front: front's sidecar gets its flavor; a change of it pushes to
    # front's sidecars alone, never a shared route configuration.
    private = {"hosts": [REVIEWS], "exportTo": ["."], "http": [{"route": [to("v2")]}]}
    mesh.updater.upsert_config(vs("own", private, namespace="front"))
    assert not mesh.push().shared
    front = sidecar("10.0.0.2", "front")
    mesh.routes.client_joined(front, REDIRECT)
    private["http"][0]["route"] = [to("v3")]
    mesh.updater.upsert_config(vs("own", private, namespace="front"))
    changes = mesh.push()
    assert not changes.shared
    assert changes.owned == {front: {types.ROUTE: {"9080"}}}
    assert mesh.subsets(front) == ["v3"]
    assert mesh.subsets(shop) == ["v1"]


def test_the_flavor_bound_is_a_setting_checked_at_start() -> None:
    assert outbound_from_env({}).max_route_flavors == 256
    assert outbound_from_env({"PILOT_MAX_ROUTE_FLAVORS": "0"}).max_route_flavors == 0
    with pytest.raises(SettingsError, match="PILOT_MAX_ROUTE_FLAVORS"):
        outbound_from_env({"PILOT_MAX_ROUTE_FLAVORS": "-1"})


def test_with_no_flavor_allowed_every_sidecar_reads_the_shared_routes() -> None:
    mesh = Mesh(max_flavors=0)
    private = {"hosts": [REVIEWS], "exportTo": ["."], "http": [{"route": [to("v2")]}]}
    mesh.updater.upsert_config(vs("own", private, namespace="front"))
    mesh.push()
    front = sidecar("10.0.0.2", "front")
    mesh.routes.client_joined(front, REDIRECT)
    assert mesh.subsets(front) == ["-"]
    assert mesh.routes.flavors == 0


def test_one_for_another_namespaces_host_exported_elsewhere_routes_no_one() -> None:
    mesh = Mesh()
    spec = {"hosts": [REVIEWS], "exportTo": ["other"], "http": [{"route": [to("v3")]}]}
    mesh.updater.upsert_config(vs("steal", spec, namespace="front"))
    mesh.push()
    other, front = sidecar("10.0.0.3", "other"), sidecar("10.0.0.2", "front")
    for proxy in (other, front):
        mesh.routes.client_joined(proxy, REDIRECT)
    assert mesh.subsets(other) == mesh.subsets(front) == ["-"]
