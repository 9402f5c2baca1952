"""One mesh from several clusters: services merged by name and namespace, endpoints from
every cluster, each endpoint marked with its cluster id, one cluster replaced alone."""

from __future__ import annotations

import pytest
from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.builders.eds import build_load_assignment
from pilot.debug import views
from pilot.registry.index import EndpointIndex
from pilot.registry.kubernetes_objects import parse_endpoint_slice, parse_endpoints, parse_service
from pilot.registry.model import EndpointSet, Node, NodeKey, Service, ServiceKey
from pilot.sources.file_format import RegistryFileError, parse_registry
from tests.support.mesh import Ep, endpoint_slice, service

WEB = ServiceKey("default", "web")
EAST, WEST = "east", "west"


def _svc(cluster: str, ports: tuple[tuple[str, int], ...] = (("http", 80),)) -> Service:
    return parse_service(service("web", ports=ports), cluster)


def _slice(cluster: str, *ips: str, zone: str = "") -> EndpointSet:
    parsed = parse_endpoint_slice(
        endpoint_slice("web", [Ep(ip, zone=zone) for ip in ips], name="web-1"), cluster
    )
    assert parsed is not None
    return parsed


def _hosts(index: EndpointIndex) -> dict[str, str]:
    """address -> the cluster id its endpoint metadata names, in web's assignment."""
    assignment = build_load_assignment(
        "web", index.services[WEB].ports[0], index.endpoint_sets(WEB)
    )
    return _by_address(assignment)


def _by_address(assignment: endpoint_pb2.ClusterLoadAssignment) -> dict[str, str]:
    return {
        lb.endpoint.address.socket_address.address: lb.metadata.filter_metadata["istio"][
            "cluster_id"
        ]
        for locality in assignment.endpoints
        for lb in locality.lb_endpoints
    }


def test_one_service_from_two_clusters_has_the_endpoints_of_both() -> None:
    index = EndpointIndex(primary=EAST)
    assert index.upsert_service(_svc(EAST)).full == {WEB}
    assert not index.upsert_service(_svc(WEST)), "the same service again changes no cluster"
    index.upsert_endpoints(_slice(EAST, "10.0.0.1"))
    change = index.upsert_endpoints(_slice(WEST, "10.1.0.1"))  # the same slice name
    assert change.endpoints == {WEB} and not change.full
    assert _hosts(index) == {"10.0.0.1": EAST, "10.1.0.1": WEST}
    assert index.clusters_of(WEB) == [EAST, WEST]


def test_a_service_stays_while_any_cluster_has_it() -> None:
    index = EndpointIndex(primary=EAST)
    index.upsert_service(_svc(EAST))
    index.upsert_service(_svc(WEST))
    assert not index.delete_service(WEB, EAST), "west still has it: no cluster change"
    assert WEB in index.services
    assert index.delete_service(WEB, WEST).full == {WEB}
    assert WEB not in index.services


def test_the_primary_clusters_ports_are_the_service_s_whole() -> None:
    index = EndpointIndex(primary=WEST)
    index.upsert_service(_svc(EAST, (("http", 80), ("admin", 9000))))
    change = index.upsert_service(_svc(WEST, (("http", 8080), ("grpc", 9090))))
    assert change.full == {WEB}
    ports = {port.name: port.port for port in index.services[WEB].ports}
    assert ports == {"http": 8080, "grpc": 9090}, "a remote copy adds no port to the local one"
    assert not index.upsert_service(_svc(EAST, (("http", 81), ("other", 1)))), "nor changes it"


def test_without_a_primary_copy_ports_merge_by_name_the_first_cluster_first() -> None:
    index = EndpointIndex(primary="local")
    index.upsert_service(_svc(WEST, (("http", 8080), ("grpc", 9090))))
    index.upsert_service(_svc(EAST, (("http", 80), ("admin", 9000))))
    ports = {port.name: port.port for port in index.services[WEB].ports}
    assert ports == {"http": 80, "admin": 9000, "grpc": 9090}


def test_each_cluster_chooses_slices_or_legacy_endpoints_for_itself() -> None:
    index = EndpointIndex()
    index.upsert_service(_svc(EAST))
    index.upsert_endpoints(_slice(EAST, "10.0.0.1"))
    subset = {"addresses": [{"ip": "10.1.0.9"}], "ports": [{"name": "http", "port": 8080}]}
    legacy_object = {"kind": "Endpoints", "metadata": {"name": "web"}, "subsets": [subset]}
    legacy = parse_endpoints(legacy_object, WEST)
    index.upsert_endpoints(legacy)
    assert _hosts(index) == {"10.0.0.1": EAST, "10.1.0.9": WEST}


def test_replacing_one_cluster_leaves_the_others_alone() -> None:
    index = EndpointIndex(primary=EAST)
    index.upsert_service(_svc(EAST))
    index.upsert_endpoints(_slice(EAST, "10.0.0.1"))
    index.upsert_service(_svc(WEST))
    index.upsert_endpoints(_slice(WEST, "10.1.0.1"))
    change = index.replace_cluster(WEST, [], [])  # the west cluster is gone
    assert change.endpoints == {WEB} and not change.full
    assert _hosts(index) == {"10.0.0.1": EAST}


def test_a_file_names_the_cluster_of_each_document() -> None:
    text = """
kind: List
cluster: west
items:
- {apiVersion: v1, kind: Service, metadata: {name: web, namespace: default},
   spec: {ports: [{name: http, port: 80}]}}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: default}
spec: {ports: [{name: tcp, port: 5432}]}
"""
    state = parse_registry(text, "mesh.yaml", "home")
    assert {(s.key.name, s.cluster) for s in state.services} == {("web", "west"), ("db", "home")}


@pytest.mark.parametrize("bad", ["''", "[west]", "7"])
def test_a_cluster_that_is_no_id_is_refused_naming_the_document(bad: str) -> None:
    text = f"kind: Service\ncluster: {bad}\nmetadata: {{name: web}}\nspec: {{ports: []}}\n"
    with pytest.raises(RegistryFileError, match=r"mesh\.yaml: document 1: cluster must be"):
        parse_registry(text, "mesh.yaml", "home")


def test_registryz_tells_which_cluster_each_part_came_from() -> None:
    index = EndpointIndex(primary=EAST)
    for cluster, ip in ((EAST, "10.0.0.1"), (WEST, "10.1.0.1")):
        index.upsert_service(_svc(cluster))
        index.upsert_endpoints(_slice(cluster, ip))
    (web,) = views.registryz(index)["services"]
    assert web["clusters"] == [EAST, WEST]
    assert [s["cluster"] for s in web["endpoint_sets"]] == [EAST, WEST]


def test_a_cluster_gone_takes_its_nodes_with_it() -> None:
    index = EndpointIndex(primary=EAST)
    index.upsert_node(Node(NodeKey(WEST, "n1"), region="eu", zone="eu-a"))
    index.upsert_node(Node(NodeKey(EAST, "n1"), region="us", zone="us-a"))
    index.upsert_service(_svc(WEST))
    index.upsert_endpoints(_slice(WEST, "10.1.0.1"))
    index.replace_cluster(WEST, [], [])
    assert not index.has_cluster(WEST)
    assert [key.cluster for key in index._nodes] == [EAST], "west's Nodes are forgotten"
