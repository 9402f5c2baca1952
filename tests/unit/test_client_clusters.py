"""Clusters and assignments that depend on the client's namespace, as the CDS, EDS and
client-cluster generators build them: a sidecar reads the rule its namespace sees (its
own namespace's, one exported to it by name, one private to the service's namespace
when it is there), its subsets' assignments and no other rule's subsets; sidecars of
other namespaces and streams that proved nothing read the shared clusters, unchanged;
tables are built once per namespace (and locality), shared, moved by a rule's change,
kept current by the endpoint fast path, and dropped with their last sidecar."""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.builders.settings import BuildSettings
from pilot.debug.views import configz
from pilot.generators.cds import ClusterGenerator
from pilot.generators.client_clusters import ClientClusters
from pilot.generators.eds import EndpointGenerator
from pilot.push.request import Changes, PendingPush, RequestSink
from pilot.registry.destination_rule import parse_destination_rule
from pilot.registry.index import EndpointIndex
from pilot.registry.model import Pod, PodKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.registry.updater import IndexUpdater
from pilot.security.identity import Identity
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import ADS_WITH_LISTENERS
from pilot.xds.interception import Interception
from pilot.xds.locality import NOWHERE, Locality
from pilot.xds.proxy import ProxyKey
from tests.unit.inbound_mesh import endpoints, svc

HOST = "reviews.shop.svc.cluster.local"
PODS = {"10.1.0.1": "v1", "10.1.0.2": "v2", "10.1.0.3": "v3"}


def cluster(port: int = 9080, subset: str = "") -> str:
    return f"outbound|{port}|{subset}|{HOST}"


def dr(name: str, namespace: str, *subsets: str, **spec: Any) -> Any:
    obj = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "host": HOST,
            "subsets": [{"name": v, "labels": {"version": v}} for v in subsets],
            **spec,
        },
    }
    return parse_destination_rule(obj, "cluster.local")


def sidecar(ip: str, namespace: str, proven: bool = True) -> ProxyKey:
    node = f"sidecar~{ip}~pod.{namespace}~{namespace}.svc.cluster.local"
    identity = Identity("cluster.local", namespace, "app").uri if proven else None
    return ProxyKey(node, identity)


class Mesh:
    """reviews (shop, 9080) on three pods labelled v1, v2, v3; the three generators."""

    def __init__(self) -> None:
        self.index, self.cache, self.stats = EndpointIndex(), ResourceCache(), XdsStats()
        self.pending = PendingPush()
        traffic = TrafficConfig()
        self.updater = IndexUpdater(
            self.index, RequestSink(self.pending.add), self.stats, traffic=traffic
        )
        settings = BuildSettings()
        cds = ClusterGenerator(self.index, self.cache, settings, self.stats, traffic)
        eds = EndpointGenerator(self.index, self.cache, settings, self.stats, traffic)
        self.eds = eds
        self.generators = (
            cds,
            eds,
            ClientClusters(self.index, self.cache, traffic, (cds, eds), self.stats),
        )
        self.clients = self.generators[2]
        self.updater.upsert_service(svc("reviews", ("http", 9080)))
        for ip, version in PODS.items():
            key = PodKey("", "shop", f"reviews-{version}")
            labels = (("version", version),)
            self.updater.upsert_pod(Pod(key, (ip,), "reviews", phase="Running", labels=labels))
        self.updater.upsert_endpoints(endpoints("reviews", PODS, ("http", 9080)))
        self.push()

    def push(self) -> Changes:
        request = self.pending.take()
        changes = Changes()
        for generator in self.generators:
            changes.add(generator.build(request))
        return changes

    def join(self, proxy: ProxyKey, locality: Locality = NOWHERE) -> None:
        self.clients.client_joined(proxy, Interception.REDIRECT, locality)

    def view(self, proxy: ProxyKey | None, locality: Locality = NOWHERE) -> Any:
        flavors = {types.CLUSTER: ADS_WITH_LISTENERS, types.ENDPOINT: locality.flavor}
        return self.cache.view(flavors, proxy)

    def clusters(self, proxy: ProxyKey | None) -> set[str]:
        return {n for n in self.view(proxy).names(types.CLUSTER) if HOST in n}

    def cluster(self, proxy: ProxyKey | None, name: str) -> cluster_pb2.Cluster:
        resource = self.view(proxy).get(types.CLUSTER, name)
        assert resource is not None, name
        return cluster_pb2.Cluster.FromString(resource.payload)

    def hosts(self, proxy: ProxyKey | None, name: str, locality: Locality = NOWHERE) -> set[str]:
        """The addresses of an assignment as `proxy` reads it."""
        resource = self.view(proxy, locality).get(types.ENDPOINT, name)
        assert resource is not None, name
        assignment = endpoint_pb2.ClusterLoadAssignment.FromString(resource.payload)
        return {
            e.endpoint.address.socket_address.address
            for group in assignment.endpoints
            for e in group.lb_endpoints
        }


def max_connections(c: cluster_pb2.Cluster) -> int | None:
    thresholds = c.circuit_breakers.thresholds
    return thresholds[0].max_connections.value if thresholds else None


def test_a_rule_in_the_clients_namespace_shapes_its_sidecars_clusters_alone() -> None:
    mesh = Mesh()
    shared = mesh.cache.shared_table(types.CLUSTER, ADS_WITH_LISTENERS)[cluster()]
    pool = {"connectionPool": {"tcp": {"maxConnections": 7}}}
    mesh.updater.upsert_config(dr("mine", "front", "v1", trafficPolicy=pool))
    front, shop = sidecar("10.2.0.1", "front"), sidecar("10.2.0.2", "shop")
    claims = sidecar("10.2.0.3", "front", proven=False)
    for proxy in (front, shop, claims):
        mesh.join(proxy)
    mesh.push()
    assert mesh.clusters(front) == {cluster(), cluster(subset="v1")}
    assert max_connections(mesh.cluster(front, cluster(subset="v1"))) == 7
    assert max_connections(mesh.cluster(front, cluster())) == 7
    assert mesh.hosts(front, cluster(subset="v1")) == {"10.1.0.1"}
    for other in (shop, claims, None):
        assert mesh.clusters(other) == {cluster()}
        assert mesh.view(other).get(types.CLUSTER, cluster()) == shared


def test_a_rule_private_to_the_services_namespace_applies_to_its_sidecars_only() -> None:
    mesh = Mesh()
    mesh.updater.upsert_config(dr("reviews", "shop", "v1", "v2", exportTo=["."]))
    shop, front = sidecar("10.2.0.2", "shop"), sidecar("10.2.0.1", "front")
    mesh.join(shop)
    mesh.join(front)
    mesh.push()
    assert mesh.clusters(shop) == {cluster(), cluster(subset="v1"), cluster(subset="v2")}
    assert mesh.clusters(front) == mesh.clusters(None) == {cluster()}


def test_a_rule_exported_by_name_applies_to_that_namespace() -> None:
    mesh = Mesh()
    mesh.updater.upsert_config(dr("reviews", "shop", "v3", exportTo=["front"]))
    front, web = sidecar("10.2.0.1", "front"), sidecar("10.2.0.4", "web")
    mesh.join(front)
    mesh.join(web)
    mesh.push()
    assert mesh.clusters(front) == {cluster(), cluster(subset="v3")}
    assert mesh.hosts(front, cluster(subset="v3")) == {"10.1.0.3"}
    assert mesh.clusters(web) == {cluster()}


def test_the_shared_rules_subsets_are_hidden_where_another_rule_applies() -> None:
    mesh = Mesh()
    mesh.updater.upsert_config(dr("reviews", "shop", "v1", "v2"))
    mesh.updater.upsert_config(dr("mine", "front", "v3"))
    front, shop = sidecar("10.2.0.1", "front"), sidecar("10.2.0.2", "shop")
    mesh.join(front)
    mesh.join(shop)
    mesh.push()
    assert mesh.clusters(front) == {cluster(), cluster(subset="v3")}
    assert mesh.view(front).get(types.CLUSTER, cluster(subset="v1")) is None
    assert mesh.view(front).get(types.ENDPOINT, cluster(subset="v1")) is None
    assert mesh.clusters(shop) == {cluster(), cluster(subset="v1"), cluster(subset="v2")}


def test_an_endpoint_change_reaches_the_flavor_as_assignments_alone() -> None:
    mesh = Mesh()
    mesh.updater.upsert_config(dr("mine", "front", "v1"))
    front, shop = sidecar("10.2.0.1", "front"), sidecar("10.2.0.2", "shop")
    mesh.join(front)
    mesh.join(shop)
    mesh.push()
    mesh.updater.upsert_endpoints(endpoints("reviews", ["10.1.0.2", "10.1.0.3"], ("http", 9080)))
    changes = mesh.push()
    assert changes.owned == {front: {types.ENDPOINT: {cluster(subset="v1")}}}
    assert types.CLUSTER not in changes.shared
    assert mesh.hosts(front, cluster(subset="v1")) == set()
    assert mesh.hosts(front, cluster()) == {"10.1.0.2", "10.1.0.3"}


def test_tables_are_shared_per_namespace_and_locality_and_dropped_with_the_last_reader() -> None:
    mesh = Mesh()
    mesh.updater.upsert_config(dr("mine", "front", "v1"))
    mesh.push()
    east, west = Locality("east", "a"), Locality("west", "b")
    one, two, three = (sidecar(f"10.2.0.{i}", "front") for i in (1, 2, 3))
    mesh.join(one, east)
    mesh.join(two, east)
    assert mesh.clients.flavors == 2  # the clusters, and east's assignments
    mesh.join(three, west)
    assert mesh.clients.flavors == 3
    assert mesh.hosts(three, cluster(subset="v1"), west) == {"10.1.0.1"}
    for proxy in (one, two, three):
        mesh.clients.client_left(proxy)
    assert mesh.clients.flavors == 0
    assert mesh.cache.overlays_of(one) is None


def test_a_rules_change_moves_the_namespaces_sidecars_in_and_out() -> None:
    mesh = Mesh()
    front = sidecar("10.2.0.1", "front")
    mesh.join(front)
    mine = dr("mine", "front", "v2")
    mesh.updater.upsert_config(mine)
    changes = mesh.push()
    assert cluster(subset="v2") in changes.owned[front][types.CLUSTER]
    assert mesh.clusters(front) == {cluster(), cluster(subset="v2")}
    mesh.updater.upsert_config(dr("mine", "front", "v3"))
    changes = mesh.push()
    assert {cluster(subset="v2"), cluster(subset="v3")} <= changes.owned[front][types.CLUSTER]
    assert mesh.clusters(front) == {cluster(), cluster(subset="v3")}
    mesh.updater.delete_config(mine.key)
    changes = mesh.push()
    assert cluster(subset="v3") in changes.owned[front][types.CLUSTER]
    assert mesh.clusters(front) == {cluster()}
    assert mesh.clients.flavors == 0
    assert mesh.stats.cluster_flavors == 0


def test_a_relabelled_pod_moves_between_the_flavors_subsets() -> None:
    mesh = Mesh()
    mesh.updater.upsert_config(dr("mine", "front", "v1", "v2"))
    front = sidecar("10.2.0.1", "front")
    mesh.join(front)
    mesh.push()
    key = PodKey("", "shop", "reviews-v3")
    pod = Pod(key, ("10.1.0.3",), "reviews", phase="Running", labels=(("version", "v1"),))
    mesh.updater.upsert_pod(pod)
    mesh.push()
    assert mesh.hosts(front, cluster(subset="v1")) == {"10.1.0.1", "10.1.0.3"}


def test_the_debug_page_lists_the_namespaces_that_follow_each_rule() -> None:
    mesh = Mesh()
    mesh.updater.upsert_config(dr("mine", "front", "v1"))
    mesh.updater.upsert_config(dr("reviews", "shop", "v2"))
    listed = configz(mesh.updater.traffic, mesh.index)
    found = {o["name"]: (o["appliedTo"], o["sidecarsOf"]) for o in listed["objects"]}
    assert found == {
        "mine": ([], {"front": ["shop/reviews"]}),
        "reviews": (["shop/reviews"], {}),
    }
