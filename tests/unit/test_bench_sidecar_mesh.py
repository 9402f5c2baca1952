"""The sidecar bench's mesh and its clients' reading of listeners, without a server.

The mesh must look like a real one to pilot: every endpoint a Pod running a
sidecar, sidecars on endpoints that never change (a changed endpoint is a Pod
gone), node ids as Istio's agent makes them. The clients must find the route
configurations listeners read over RDS, as Envoy does, or their sync never ends.
The bench's flags: a storm's sizes get enough endpoints, and only sidecars ask for
certificates.
"""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import config_source_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from bench import clients, sidecar, wire
from bench.clients import _route_names
from bench.sidecar_mesh import TLS_MODE, SidecarMesh


def _mesh() -> SidecarMesh:
    return SidecarMesh(30, 3, sidecars=45, additions=2, changes=40, seed=3)


def _addresses(slice_: dict) -> list[str]:
    return [e["addresses"][0] for e in slice_["endpoints"]]


def test_every_endpoint_ever_used_is_a_running_pod_with_a_sidecar() -> None:
    mesh = _mesh()
    slices = mesh.slices + [c.slice for c in mesh.changes] + [a.slice for a in mesh.additions]
    for slice_ in slices:
        for endpoint in slice_["endpoints"]:
            pod = mesh.pods[endpoint["addresses"][0]]
            assert endpoint["targetRef"]["name"] == pod["metadata"]["name"]
            assert pod["metadata"]["labels"][TLS_MODE] == "istio"
            assert pod["status"]["phase"] == "Running"
    assert "kind: Pod" in mesh.yaml()


def test_sidecars_are_pods_of_the_mesh_whose_endpoints_never_change() -> None:
    mesh = _mesh()
    ids = [node["id"] for node in mesh.sidecars]
    assert len(set(ids)) == 45
    ours = {node["metadata"]["INSTANCE_IPS"] for node in mesh.sidecars}
    final = {ip for s in mesh.slices for ip in _addresses(s)}  # after every change
    assert ours <= final, "a change replaced an endpoint a sidecar sits on"
    for node in mesh.sidecars:
        ip, pod = node["metadata"]["INSTANCE_IPS"], node["metadata"]["POD_NAME"]
        assert node["id"] == f"sidecar~{ip}~{pod}.default~default.svc.cluster.local"
        assert mesh.pods[ip]["metadata"]["name"] == pod


def test_a_service_added_is_expected_on_all_four_types() -> None:
    (first, _) = _mesh().additions
    assert {kind for kind, _ in first.expected} == set(wire.SHORT)


def _typed(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _chain(message: Message, name: str) -> listener_components_pb2.FilterChain:
    network_filter = listener_components_pb2.Filter(name=name, typed_config=_typed(message))
    return listener_components_pb2.FilterChain(filters=[network_filter])


def test_clients_subscribe_to_the_routes_listeners_read_over_rds() -> None:
    source = config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource())
    rds = hcm_pb2.Rds(route_config_name="9080", config_source=source)
    http = hcm_pb2.HttpConnectionManager(stat_prefix="x", rds=rds)
    inline = hcm_pb2.HttpConnectionManager(stat_prefix="y")  # its routes inline: no RDS
    tcp = tcp_proxy_pb2.TcpProxy(stat_prefix="z", cluster="c")
    listener = listener_pb2.Listener(
        name="0.0.0.0_9080",
        filter_chains=[_chain(http, "hcm"), _chain(inline, "hcm"), _chain(tcp, "tcp")],
        default_filter_chain=_chain(http, "hcm"),
    )
    assert _route_names(listener.SerializeToString()) == ("9080",)
    only_tcp = listener_pb2.Listener(name="10.0.0.1_5432", filter_chains=[_chain(tcp, "tcp")])
    assert _route_names(only_tcp.SerializeToString()) == ()


def test_a_storm_of_sidecars_gets_enough_endpoints_unless_told_too_few() -> None:
    storm = ["--clients", "3000", "--services", "100"]
    assert sidecar.parse_args(storm).config.endpoints == 31  # 30 sidecars on each, 1 to change
    assert sidecar.parse_args(["--clients", "5", "--services", "20"]).config.endpoints == 3
    with pytest.raises(SystemExit):  # told: 30 sidecars on 30 endpoints leave none to change
        sidecar.parse_args([*storm, "--endpoints", "30"])


def test_only_sidecars_open_sds_streams() -> None:
    args = clients.parse_args(["--target", "x:1", "--streams", "2", "--nodes", "n", "--secrets"])
    assert args.secrets
    with pytest.raises(SystemExit):  # plain streams have no identity to ask a certificate for
        clients.parse_args(["--target", "x:1", "--streams", "2", "--secrets"])
