"""Endpoint locality from Nodes; priorities and weights by a DestinationRule's locality
load balancing, one variant per proxy locality where the rule asks for it."""

from __future__ import annotations

from typing import Any

from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.builders.settings import BuildSettings
from pilot.generators.eds import EndpointGenerator
from pilot.registry.destination_rule import parse_destination_rule
from pilot.registry.index import EndpointIndex, IndexChange
from pilot.registry.kubernetes_objects import parse_endpoint_slice, parse_node, parse_service
from pilot.registry.model import EndpointSet, NodeKey, ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.locality import Locality
from tests.support.mesh import Ep, cluster_name, endpoint_slice, node, service

WEB = ServiceKey("default", "web")
CLUSTER = "east"
NAME = cluster_name("web", 80)


def _slice(*endpoints: Ep) -> EndpointSet:
    parsed = parse_endpoint_slice(endpoint_slice("web", endpoints), CLUSTER)
    assert parsed is not None
    return parsed


def _index(*endpoints: Ep) -> EndpointIndex:
    index = EndpointIndex()
    index.upsert_service(parse_service(service("web"), CLUSTER))
    index.upsert_endpoints(_slice(*endpoints))
    return index


def _localities(index: EndpointIndex) -> dict[str, Locality]:
    endpoint_set = index.endpoint_sets(WEB)[0]
    return {
        endpoint.addresses[0]: index.locality_of(CLUSTER, endpoint)
        for group in endpoint_set.groups
        for endpoint in group.endpoints
    }


def test_region_from_the_node_zone_from_the_slice_then_the_node() -> None:
    index = _index(Ep("10.0.0.1", zone="slice-zone", node="n1"), Ep("10.0.0.2", node="n1"))
    index.upsert_node(parse_node(node("n1", "eu", "node-zone"), CLUSTER))
    assert _localities(index) == {
        "10.0.0.1": Locality("eu", "slice-zone"),
        "10.0.0.2": Locality("eu", "node-zone"),
    }


def test_without_a_region_the_cluster_id_is_the_region() -> None:
    index = _index(Ep("10.0.0.1", zone="z", node="unlabelled"), Ep("10.0.0.2"))
    index.upsert_node(parse_node(node("unlabelled"), CLUSTER))
    assert set(_localities(index).values()) == {Locality(CLUSTER, "z"), Locality(CLUSTER, "")}


def test_a_node_relabelled_is_an_endpoint_push_of_its_services_only() -> None:
    index = _index(Ep("10.0.0.1", node="n1"))
    index.upsert_service(parse_service(service("other"), CLUSTER))
    first = index.upsert_node(parse_node(node("n1", "eu", "a"), CLUSTER))
    assert first.endpoints == {WEB} and not first.full
    # Status updates and unrelated labels move no endpoint: no push at all.
    unrelated = node("n1", "eu", "a")
    unrelated["metadata"]["labels"]["team"] = "x"
    assert not index.upsert_node(parse_node(unrelated, CLUSTER))
    assert not index.upsert_node(parse_node(node("n2", "us", "b"), CLUSTER))
    moved = index.upsert_node(parse_node(node("n1", "eu", "b"), CLUSTER))
    assert moved.endpoints == {WEB} and not moved.full
    assert index.delete_node(NodeKey(CLUSTER, "n1")).endpoints == {WEB}
    assert _localities(index) == {"10.0.0.1": Locality(CLUSTER, "")}


def _priorities(cache: ResourceCache, flavor: str) -> dict[tuple[str, str], int]:
    resource = cache.get(types.ENDPOINT, NAME, flavor=flavor)
    assert resource is not None
    assignment = endpoint_pb2.ClusterLoadAssignment.FromString(resource.payload)
    return {(g.locality.region, g.locality.zone): g.priority for g in assignment.endpoints}


def _eu_us_index() -> EndpointIndex:
    index = _index(
        Ep("10.0.0.1", node="eu-a"), Ep("10.0.0.2", node="eu-b"), Ep("10.0.0.3", node="us-c")
    )
    for name, region, zone in (("eu-a", "eu", "a"), ("eu-b", "eu", "b"), ("us-c", "us", "c")):
        index.upsert_node(parse_node(node(name, region, zone), CLUSTER))
    return index


def _with_rule(traffic_policy: dict[str, Any]) -> TrafficConfig:
    traffic = TrafficConfig()
    traffic.upsert(
        parse_destination_rule(
            {
                "apiVersion": "networking.istio.io/v1",
                "kind": "DestinationRule",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"host": "web", "trafficPolicy": traffic_policy},
            },
            "cluster.local",
        )
    )
    return traffic


OUTLIERS = {"outlierDetection": {"consecutive5xxErrors": 1}}


def test_without_outlier_detection_every_proxy_gets_one_flat_assignment() -> None:
    """Istio's default: no failover without outlier detection (Envoy would never see a
    host fail), so every proxy locality reads the same bytes, encoded once."""
    cache, stats = ResourceCache(), XdsStats()
    builder = EndpointGenerator(_eu_us_index(), cache, BuildSettings(), stats)
    builder.apply(IndexChange(full=frozenset({WEB})))
    eu_a = Locality("eu", "a")
    before = stats.serializations[types.ENDPOINT]
    builder.add_locality(eu_a)
    assert stats.serializations[types.ENDPOINT] == before, "a new locality encodes nothing"
    flat = {("eu", "a"): 0, ("eu", "b"): 0, ("us", "c"): 0}
    assert _priorities(cache, "") == _priorities(cache, eu_a.flavor) == flat
    shared = cache.get(types.ENDPOINT, NAME)
    assert cache.get(types.ENDPOINT, NAME, flavor=eu_a.flavor) == shared
    before = stats.serializations[types.ENDPOINT]
    builder.apply(IndexChange(endpoints=frozenset({WEB})))
    assert stats.serializations[types.ENDPOINT] - before == 1, "one encoding for both"


def test_with_outlier_detection_each_proxy_locality_gets_its_own_priorities() -> None:
    cache, stats = ResourceCache(), XdsStats()
    traffic = _with_rule(OUTLIERS)
    builder = EndpointGenerator(_eu_us_index(), cache, BuildSettings(), stats, traffic)
    builder.apply(IndexChange(full=frozenset({WEB})))
    eu_a, us_x = Locality("eu", "a"), Locality("us", "x")
    builder.add_locality(eu_a)
    builder.add_locality(us_x)
    assert _priorities(cache, "") == {("eu", "a"): 0, ("eu", "b"): 0, ("us", "c"): 0}
    assert _priorities(cache, eu_a.flavor) == {("eu", "a"): 0, ("eu", "b"): 1, ("us", "c"): 2}
    # No endpoint in zone x: same region moves up to 0, the rest to 1 (contiguous).
    assert _priorities(cache, us_x.flavor) == {("eu", "a"): 1, ("eu", "b"): 1, ("us", "c"): 0}
    builder.drop_locality(us_x)
    assert cache.get(types.ENDPOINT, NAME, flavor=us_x.flavor) is None


def test_failover_sends_a_region_to_its_target_before_the_others() -> None:
    policy = {**OUTLIERS, "loadBalancer": {"localityLbSetting": {"failover": [
        {"from": "us", "to": "ap"}]}}}  # fmt: skip
    index = _eu_us_index()
    index.upsert_endpoints(_slice(Ep("10.0.0.1", node="eu-a"), Ep("10.0.0.4", node="ap-d")))
    index.upsert_node(parse_node(node("ap-d", "ap", "d"), CLUSTER))
    cache = ResourceCache()
    builder = EndpointGenerator(index, cache, BuildSettings(), XdsStats(), _with_rule(policy))
    builder.apply(IndexChange(full=frozenset({WEB})))
    builder.add_locality(Locality("us", "c"))
    # No endpoint left in us: ap (the failover target) first, eu after.
    assert _priorities(cache, Locality("us", "c").flavor) == {("ap", "d"): 0, ("eu", "a"): 1}


def _weights(cache: ResourceCache, flavor: str) -> dict[tuple[str, str], tuple[int, int]]:
    """locality -> (its weight, how many endpoints it holds)."""
    resource = cache.get(types.ENDPOINT, NAME, flavor=flavor)
    assert resource is not None
    assignment = endpoint_pb2.ClusterLoadAssignment.FromString(resource.payload)
    return {
        (g.locality.region, g.locality.zone): (g.load_balancing_weight.value, len(g.lb_endpoints))
        for g in assignment.endpoints
    }


def test_distribute_gives_the_proxys_localities_their_weights() -> None:
    policy = {"loadBalancer": {"localityLbSetting": {"distribute": [
        {"from": "eu/a", "to": {"eu/a": 80, "us/*": 20}},
        {"from": "*", "to": {"eu": 100}},
    ]}}}  # fmt: skip
    cache = ResourceCache()
    builder = EndpointGenerator(
        _eu_us_index(), cache, BuildSettings(), XdsStats(), _with_rule(policy)
    )
    builder.apply(IndexChange(full=frozenset({WEB})))
    builder.add_locality(Locality("eu", "a"))
    builder.add_locality(Locality("us", "c"))
    assert _weights(cache, Locality("eu", "a").flavor) == {
        ("eu", "a"): (80, 1), ("eu", "b"): (1, 0), ("us", "c"): (20, 1)
    }  # fmt: skip
    # The catch-all: eu's two zones share 100 by their endpoints; us gets nothing.
    assert _weights(cache, Locality("us", "c").flavor) == {
        ("eu", "a"): (50, 1), ("eu", "b"): (50, 1), ("us", "c"): (1, 0)
    }  # fmt: skip
