"""Envoy accepts the `virtualInbound` listener and `inbound|P||` clusters pilot serves a sidecar.

A pod whose IP is an endpoint of services on HTTP, gRPC and TCP ports (one
of them the same target port under two services, one a UDP port, one a
port named like markup), in each PeerAuthentication mode of its namespace.
What pilot serves that sidecar over delta ADS goes into a bootstrap (with
the `sds-grpc` cluster every sidecar's bootstrap has) that `envoy --mode
validate` must accept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from envoy.config.listener.v3 import listener_pb2

from pilot.xds import types
from tests.integration.envoy_validation import POD_ID, POD_IP, bootstrap_of, fetch
from tests.support.envoy_process import validate_bootstrap
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import running_pilot
from tests.support.xds_client import XdsClient, node


def pod_mesh(mode: str) -> list[dict[str, Any]]:
    reviews = service("reviews", "shop", [("http", 9080), ("grpc-api", 9090), ("tcp-db", 5432)])
    reviews["spec"]["ports"].append({"name": "dns", "port": 53, "protocol": "UDP"})
    odd = service("odd", "shop", [("http\n<b>", 7000)])
    same_target = service("reviews-v2", "shop", [("tcp", 9999)])
    return [
        reviews,
        odd,
        same_target,
        endpoint_slice(
            "reviews",
            [Ep(POD_IP), Ep("10.44.0.8")],
            "shop",
            [("http", 8080), ("grpc-api", 9090), ("tcp-db", 5432), ("dns", 53)],
        ),
        endpoint_slice("odd", [Ep(POD_IP)], "shop", [("http\n<b>", 7001)]),
        endpoint_slice("reviews-v2", [Ep(POD_IP)], "shop", [("tcp", 8080)]),
        {
            "apiVersion": "security.istio.io/v1",
            "kind": "PeerAuthentication",
            "metadata": {"name": "default", "namespace": "shop"},
            "spec": {"mtls": {"mode": mode}},
        },
    ]


@pytest.mark.parametrize("mode", ["PERMISSIVE", "STRICT", "DISABLE", "UNSET"])
async def test_envoy_validates_the_inbound_side_in_every_mode(tmp_path: Path, mode: str) -> None:
    async with (
        running_pilot(tmp_path, pod_mesh(mode)) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        held = await fetch(client.delta_ads(node(POD_ID)))
    inbound: listener_pb2.Listener = held[types.LISTENER]["virtualInbound"]
    ports = {c.filter_chain_match.destination_port.value for c in inbound.filter_chains}
    assert ports == {0, 15006, 8080, 9090, 5432, 7001}, "target ports; UDP none"
    transports = {c.filter_chain_match.transport_protocol for c in inbound.filter_chains}
    expected = {
        "PERMISSIVE": {"tls", "raw_buffer", ""},
        "UNSET": {"tls", "raw_buffer", ""},
        "STRICT": {"tls", ""},
        "DISABLE": {"raw_buffer", ""},
    }[mode]
    assert transports == expected
    assert {"inbound|8080||", "inbound|9090||", "inbound|5432||", "inbound|7001||"} <= set(
        held[types.CLUSTER]
    )
    boot = bootstrap_of(held)  # with the `sds-grpc` cluster the secrets name
    path = tmp_path / "inbound.pb"
    path.write_bytes(boot.SerializeToString())
    validate_bootstrap(path)
