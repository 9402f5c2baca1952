"""Registry objects to Envoy resources: parsing, port matching, health, localities, clusters."""

from __future__ import annotations

import re
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2, config_source_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.builders.cds import build_cluster
from pilot.builders.eds import build_load_assignment, collect_hosts, encode_load_assignment
from pilot.builders.locality_lb import FLAT, LocalityRule, Placement, placements
from pilot.registry.kubernetes_objects import (
    ObjectError,
    parse_endpoint_slice,
    parse_endpoints,
    parse_service,
)
from pilot.registry.locality_lb import Distribute
from pilot.registry.model import (
    Endpoint,
    EndpointGroup,
    EndpointPort,
    EndpointSet,
    EndpointSetKey,
    Health,
    ServiceKey,
    ServicePort,
)
from pilot.xds.flavor import Flavor
from pilot.xds.locality import NOWHERE, Locality
from tests.support.mesh import Ep, endpoint_slice, service


def _hosts(assignment: Any) -> dict[tuple[str, int], tuple[int, str]]:
    found = {}
    for group in assignment.endpoints:
        for lb in group.lb_endpoints:
            address = lb.endpoint.address.socket_address
            found[(address.address, address.port_value)] = (lb.health_status, group.locality.zone)
    return found


def test_service_ports_and_clear_errors() -> None:
    parsed = parse_service(service("web", "shop", ports=(("http", 80), ("grpc", 90))))
    assert [(p.name, p.port) for p in parsed.ports] == [("http", 80), ("grpc", 90)]
    bad = service("web", "shop")
    bad["spec"]["ports"][0]["port"] = "eighty"
    with pytest.raises(ObjectError, match=r"Service shop/web: spec.ports\[0\].port"):
        parse_service(bad)


def test_external_name_service_has_no_ports() -> None:
    obj = service("ext")
    obj["spec"]["type"] = "ExternalName"
    assert parse_service(obj).ports == ()


def test_slice_without_service_label_is_an_error() -> None:
    obj = endpoint_slice("web", [Ep("10.0.0.1")])
    del obj["metadata"]["labels"]
    with pytest.raises(ObjectError, match=re.escape("kubernetes.io/service-name")):
        parse_endpoint_slice(obj)


def test_fqdn_slices_are_skipped() -> None:
    obj = endpoint_slice("web", [Ep("10.0.0.1")])
    obj["addressType"] = "FQDN"
    assert parse_endpoint_slice(obj) is None


def test_conditions_map_to_health_and_missing_ones_mean_ready() -> None:
    obj = endpoint_slice(
        "web",
        [
            Ep("10.0.0.1", ready=None, zone="a"),
            Ep("10.0.0.2", ready=False, serving=True, terminating=True, zone="a"),
            Ep("10.0.0.3", ready=False, serving=False, terminating=True),
            Ep("10.0.0.4", ready=False),
        ],
    )
    endpoint_set = parse_endpoint_slice(obj)
    assert endpoint_set is not None
    assignment = build_load_assignment("c", ServicePort("http", 80), [endpoint_set])
    assert _hosts(assignment) == {
        ("10.0.0.1", 8080): (health_check_pb2.HEALTHY, "a"),
        ("10.0.0.2", 8080): (health_check_pb2.DRAINING, "a"),
    }


def test_ports_match_by_service_port_name() -> None:
    obj = endpoint_slice("web", [Ep("10.0.0.1")], ports=(("http", 8080), ("admin", 9000)))
    endpoint_set = parse_endpoint_slice(obj)
    assert endpoint_set is not None
    admin = build_load_assignment("c", ServicePort("admin", 90), [endpoint_set])
    assert set(_hosts(admin)) == {("10.0.0.1", 9000)}
    missing = build_load_assignment("c", ServicePort("metrics", 91), [endpoint_set])
    assert list(missing.endpoints) == []
    assert missing.cluster_name == "c"


def test_slices_merge_and_duplicates_appear_once_with_best_health() -> None:
    first = parse_endpoint_slice(
        endpoint_slice(
            "web", [Ep("10.0.0.1", ready=False, serving=True, terminating=True)], name="s1"
        )
    )
    second = parse_endpoint_slice(
        endpoint_slice("web", [Ep("10.0.0.1"), Ep("10.0.0.2")], name="s2")
    )
    assert first is not None and second is not None
    assignment = build_load_assignment("c", ServicePort("http", 80), [first, second])
    hosts = _hosts(assignment)
    assert hosts[("10.0.0.1", 8080)][0] == health_check_pb2.HEALTHY
    assert len(hosts) == 2


def test_endpoints_group_by_zone_in_a_stable_order() -> None:
    obj = endpoint_slice(
        "web", [Ep("10.0.0.2", zone="b"), Ep("10.0.0.1", zone="a"), Ep("10.0.0.3", zone="b")]
    )
    endpoint_set = parse_endpoint_slice(obj)
    assert endpoint_set is not None
    one = build_load_assignment("c", ServicePort("http", 80), [endpoint_set])
    assert [g.locality.zone for g in one.endpoints] == ["a", "b"]
    assert [len(g.lb_endpoints) for g in one.endpoints] == [1, 2]
    reordered = dict(obj, endpoints=list(reversed(obj["endpoints"])))
    other = parse_endpoint_slice(reordered)
    assert other is not None
    two = build_load_assignment("c", ServicePort("http", 80), [other])
    assert one.SerializeToString(deterministic=True) == two.SerializeToString(deterministic=True)


def test_legacy_endpoints_ready_and_not_ready_addresses() -> None:
    obj = {
        "kind": "Endpoints",
        "metadata": {"name": "web", "namespace": "shop"},
        "subsets": [
            {
                "addresses": [{"ip": "10.0.0.1"}],
                "notReadyAddresses": [{"ip": "10.0.0.2"}],
                "ports": [{"name": "http", "port": 8080}],
            }
        ],
    }
    endpoint_set = parse_endpoints(obj)
    assert str(endpoint_set.service) == "shop/web"
    assignment = build_load_assignment("c", ServicePort("http", 80), [endpoint_set])
    assert set(_hosts(assignment)) == {("10.0.0.1", 8080)}


def test_cluster_config_source_depends_on_how_it_was_fetched() -> None:
    port = ServicePort("http", 80)
    ads = build_cluster("c", port, Flavor.ADS, "xds-grpc")
    assert ads.eds_cluster_config.eds_config.HasField("ads")
    assert ads.eds_cluster_config.eds_config.resource_api_version == config_source_pb2.V3
    for flavor, api_type in (
        (Flavor.GRPC, config_source_pb2.ApiConfigSource.GRPC),
        (Flavor.DELTA_GRPC, config_source_pb2.ApiConfigSource.DELTA_GRPC),
    ):
        api = build_cluster(
            "c", port, flavor, "my-xds"
        ).eds_cluster_config.eds_config.api_config_source
        assert api.api_type == api_type
        assert api.grpc_services[0].envoy_grpc.cluster_name == "my-xds"


def test_grpc_ports_get_http2_upstreams() -> None:
    key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    assert (
        key
        in build_cluster(
            "c", ServicePort("grpc-api", 90), Flavor.ADS, "x"
        ).typed_extension_protocol_options
    )
    assert (
        key
        in build_cluster(
            "c", ServicePort("x", 90, app_protocol="grpc"), Flavor.ADS, "x"
        ).typed_extension_protocol_options
    )
    assert (
        key
        not in build_cluster(
            "c", ServicePort("http", 80), Flavor.ADS, "x"
        ).typed_extension_protocol_options
    )


def _oracle_priorities(proxy: Locality, localities: set[Locality]) -> dict[Locality, int]:
    """Istio's failover order, written out: zone 0, region 1, elsewhere 2, gaps closed (a
    proxy with no locality is Istio's empty one, nearest to endpoints with none)."""

    def level(locality: Locality) -> int:
        if locality.region != proxy.region:
            return 2
        return 0 if locality.zone == proxy.zone else 1

    used = sorted({level(locality) for locality in localities})
    return {locality: used.index(level(locality)) for locality in localities}


def _oracle_placements(
    rule: LocalityRule, proxy: Locality, sizes: dict[Locality, int]
) -> dict[Locality, Placement]:
    """Default failover from the oracle above; the other rules' placements as computed
    (their arithmetic is held to istiod's by tests/cluster/test_locality_lb_istiod.py):
    this test is about the bytes."""
    if rule == LocalityRule(failover=True):
        return {loc: Placement(p) for loc, p in _oracle_priorities(proxy, set(sizes)).items()}
    return placements(rule, proxy, sizes)


def _protobuf_assignment(
    name: str, hosts: dict[Any, Any], proxy: Locality = NOWHERE, rule: LocalityRule = FLAT
) -> bytes:
    """The assignment as protobuf itself serializes it: the oracle for the hand encoder."""
    by_locality: dict[Locality, list[endpoint_components_pb2.LbEndpoint]] = {}
    statuses = {
        Health.HEALTHY: health_check_pb2.HEALTHY,
        Health.DRAINING: health_check_pb2.DRAINING,
    }
    for (address, number), (health, locality, cluster, sidecar) in sorted(hosts.items()):
        lb = endpoint_components_pb2.LbEndpoint(health_status=statuses[health])
        lb.endpoint.address.socket_address.address = address
        lb.endpoint.address.socket_address.port_value = number
        if cluster:
            lb.metadata.filter_metadata["istio"].update({"cluster_id": cluster})
        if sidecar:
            lb.metadata.filter_metadata["envoy.transport_socket_match"].update({"tlsMode": "istio"})
        by_locality.setdefault(locality, []).append(lb)
    message = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    placed = _oracle_placements(rule, proxy, {k: len(v) for k, v in by_locality.items()})
    for locality in sorted(by_locality):
        group = endpoint_components_pb2.LocalityLbEndpoints(
            locality=base_pb2.Locality(region=locality.region, zone=locality.zone),
            lb_endpoints=[] if placed[locality].dropped else by_locality[locality],
            priority=placed[locality].priority,
        )
        if placed[locality].weight is not None:
            group.load_balancing_weight.value = placed[locality].weight or 0
        message.endpoints.append(group)
    return bytes(message.SerializeToString(deterministic=True))


_ENDPOINTS = st.lists(
    st.builds(
        Endpoint,
        addresses=st.tuples(st.sampled_from(["10.0.0.1", "10.0.0.2", "fd00::1", "192.168.7.250"])),
        ready=st.booleans(),
        serving=st.booleans(),
        terminating=st.booleans(),
        zone=st.sampled_from(["", "a", "zone-b", "é"]),
        node_name=st.sampled_from(["", "node-1", "node-2"]),
    ),
    max_size=12,
)
_NAMES = st.sampled_from(["", "a", "zone-b", "é", "us-east"])
_RULES = st.sampled_from(
    [
        FLAT,
        LocalityRule(failover=True),
        LocalityRule(failover=True, failover_to=(("a", "us-east"), ("é", "a"))),
        LocalityRule(distribute=(Distribute("a/*", (("us-east", 20), ("a/zone-b", 80))),)),
        LocalityRule(distribute=(Distribute("*", (("é/*", 30), ("a", 70))),)),
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    endpoints=_ENDPOINTS,
    number=st.integers(min_value=0, max_value=65535),
    name=st.sampled_from(["", "outbound|80||web.shop.svc.cluster.local"]),
    cluster=st.sampled_from(["", "Kubernetes", "east-1", "é"]),
    node_regions=st.fixed_dictionaries({"node-1": _NAMES, "node-2": _NAMES}),
    proxy=st.builds(Locality, region=_NAMES, zone=_NAMES),
    rule=_RULES,
)
def test_hand_encoded_assignments_are_protobufs_own_bytes(
    *,
    endpoints: list[Endpoint],
    number: int,
    name: str,
    cluster: str,
    node_regions: dict[str, str],
    proxy: Locality,
    rule: LocalityRule,
) -> None:
    """Versions are content hashes: the hand encoder must give protobuf's exact bytes,
    for every proxy locality and locality rule (priorities, weights, localities
    `distribute` sends nothing) and endpoint regions and zones."""
    group = EndpointGroup((EndpointPort("http", number),), tuple(endpoints))
    endpoint_set = EndpointSet(
        EndpointSetKey("EndpointSlice", "shop", "web-1", cluster),
        ServiceKey("shop", "web"),
        (group,),
    )

    def locate(at: str, endpoint: Endpoint) -> Locality:
        return Locality(node_regions.get(endpoint.node_name) or at, endpoint.zone)

    port = ServicePort("http", 80)
    hosts = collect_hosts(port, [endpoint_set], locate)
    encoded = encode_load_assignment(
        name, port, [endpoint_set], proxy=proxy, locate=locate, rule=rule
    )
    assert encoded == _protobuf_assignment(name, hosts, proxy, rule)
