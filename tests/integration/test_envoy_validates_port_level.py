"""Envoy accepts a sidecar's `virtualInbound` with a mode per port (portLevelMtls).

The registry file (the file source) names the pod's services and Pod, a
namespace-wide STRICT policy with port exceptions (one on a port no service
names, two on the sidecar's own ports), and a workload policy selecting the pod by its
labels. What pilot serves that sidecar goes into a bootstrap that `envoy --mode
validate` must accept, with each port's chains in its mode and no chain of a
port's own for 15006 (it stays the blackhole's) or 15001.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envoy.config.listener.v3 import listener_pb2

from pilot.xds import types
from tests.integration.envoy_validation import POD_ID, POD_IP, bootstrap_of, fetch
from tests.support.envoy_process import validate_bootstrap
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import running_pilot
from tests.support.xds_client import XdsClient, node


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": spec,
    }


def objects() -> list[dict[str, Any]]:
    reviews = service("reviews", "shop", [("http", 9080), ("tcp-db", 5432)])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "reviews-1", "namespace": "shop", "labels": {"app": "reviews"}},
        "spec": {"serviceAccountName": "reviews"},
        "status": {"phase": "Running", "podIP": POD_IP},
    }
    namespace_ports = {
        "8080": {"mode": "PERMISSIVE"},
        "15006": {"mode": "DISABLE"},  # the sidecar's own ports: no chain of their own
        "15001": {"mode": "DISABLE"},
    }
    workload_ports = {"5432": {"mode": "DISABLE"}, "12345": {"mode": "PERMISSIVE"}}
    return [
        reviews,
        endpoint_slice("reviews", [Ep(POD_IP)], "shop", [("http", 8080), ("tcp-db", 5432)]),
        pod,
        policy("default", {"mtls": {"mode": "STRICT"}, "portLevelMtls": namespace_ports}),
        policy(
            "reviews",
            {"selector": {"matchLabels": {"app": "reviews"}}, "portLevelMtls": workload_ports},
        ),
    ]


def transports(inbound: listener_pb2.Listener) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for chain in inbound.filter_chains:
        match = chain.filter_chain_match
        found.setdefault(match.destination_port.value, set()).add(match.transport_protocol)
    return found


async def test_envoy_validates_a_mode_per_port(tmp_path: Path) -> None:
    async with (
        running_pilot(tmp_path, objects()) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        held = await fetch(client.delta_ads(node(POD_ID)))
    inbound: listener_pb2.Listener = held[types.LISTENER]["virtualInbound"]
    assert transports(inbound) == {
        0: {"tls"},  # any other port: the namespace's STRICT
        8080: {"tls", "raw_buffer"},  # the namespace's exception
        5432: {"raw_buffer"},  # the workload's exception, DISABLE
        12345: {"tls", "raw_buffer"},  # a port no service names, as Istio: passthrough
        15006: {""},  # the blackhole only
    }
    boot = bootstrap_of(held)
    path = tmp_path / "inbound.pb"
    path.write_bytes(boot.SerializeToString())
    validate_bootstrap(path)
