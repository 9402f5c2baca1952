"""Envoy accepts every listener, route and cluster pilot generates, from a hostile registry.

The registry holds what makes names and domains go wrong: a port name with a
newline and markup, a Service named `*`, a headless TCP Service, two services
with one ClusterIP, one short name in two namespaces, HTTP and TCP on one port,
1,000 services on one port, pods with sidecars under several service
accounts (the clusters' auto mTLS sockets and SANs). What pilot serves to a
REDIRECT and a NONE proxy goes, as fetched over ADS, into a bootstrap (binary
proto) that `envoy --mode validate` must accept; the routes also inline, so
that Envoy checks every cluster they name exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pilot.xds import types
from tests.integration.envoy_validation import bootstrap_of
from tests.support.envoy_process import validate_bootstrap
from tests.support.mesh import Ep, endpoint_slice, pod, service
from tests.support.pilot import running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

CROWD = 1000
TIMEOUT = 30.0


def _ip(obj: dict[str, Any], ip: str) -> dict[str, Any]:
    obj["spec"]["clusterIP"] = ip
    return obj


def hostile_mesh() -> list[dict[str, Any]]:
    crowd = [
        _ip(service(f"crowd-{i:04d}"), f"10.97.{i // 250}.{1 + i % 250}") for i in range(CROWD)
    ]
    return [
        *crowd,
        _ip(service("odd-port", ports=[("http\n<script>x</script>", 7000)]), "10.96.0.1"),
        service("*"),
        _ip(service("headless", ports=[("tcp", 5432)]), "None"),
        _ip(service("db-a", ports=[("tcp", 5432)]), "10.96.0.2"),
        _ip(service("db-b", ports=[("tcp", 5432)]), "10.96.0.2"),  # the same ClusterIP
        _ip(service("reviews", "default", [("http", 9080)]), "10.96.0.3"),
        _ip(service("reviews", "other", [("http", 9080)]), "10.96.0.4"),
        _ip(service("mixed-tcp", ports=[("mongo", 9080)]), "10.96.0.5"),
        _ip(service("grpc", ports=[("grpc-web", 9090)]), "10.96.0.6"),
        endpoint_slice("reviews", [Ep("10.1.0.1"), Ep("10.1.0.2")], ports=[("http", 9080)]),
        pod("reviews-1", "10.1.0.1", service_account="reviews", sidecar=True),
        pod("reviews-2", "10.1.0.2", service_account="reviews-v2", sidecar=True),
        endpoint_slice("db-a", [Ep("10.1.0.3")], ports=[("tcp", 5432)]),
        pod("db-a-1", "10.1.0.3", service_account="db", sidecar=True),
    ]


async def fetch_all(stream: DeltaStream) -> dict[str, dict[str, Any]]:
    """Every cluster and listener, and the routes they name, as served to this stream."""
    held: dict[str, dict[str, Any]] = {t: {} for t in (types.CLUSTER, types.LISTENER, types.ROUTE)}
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.LISTENER, ["*"])
    await stream.subscribe(types.ROUTE, ["80", "9080", "9090"])
    while not (
        held[types.ROUTE].keys() >= {"80", "9080", "9090"}
        and "PassthroughCluster" in held[types.CLUSTER]
    ):
        response = await stream.next_response(TIMEOUT)
        for name, resource in delta_resources(response).items():
            held[response.type_url][name] = resource.message
        await stream.ack(response)
    return held


@pytest.mark.parametrize("mode", ["REDIRECT", "NONE"])
async def test_envoy_validates_what_pilot_generates_from_a_hostile_registry(
    tmp_path: Path, mode: str
) -> None:
    metadata = {"INTERCEPTION_MODE": mode}
    async with (
        running_pilot(tmp_path, hostile_mesh()) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        located = node(metadata=metadata)
        held = await fetch_all(client.delta_ads(located))
    listeners = set(held[types.LISTENER])
    if mode == "REDIRECT":
        assert {"virtualOutbound", "0.0.0.0_80", "0.0.0.0_9080", "0.0.0.0_9090"} <= listeners
        assert "10.96.0.2_5432" in listeners, "one listener for the ClusterIP given twice"
        assert "10.96.0.5_9080" in listeners and "10.96.0.1_7000" in listeners
        assert not any(name.startswith("None") for name in listeners), "headless: none"
    else:
        assert "virtualOutbound" not in listeners
        assert {"127.0.0.1_80", "127.0.0.1_9080", "127.0.0.1_5432", "127.0.0.1_7000"} <= listeners
    assert not any("*" in name or "\n" in name for name in listeners)
    crowd = held[types.ROUTE]["80"]
    assert len(crowd.virtual_hosts) >= CROWD
    # Its domains, and Istio's default retry policy (about 170 bytes, as Istio sends it).
    assert len(crowd.SerializeToString()) < 600 * CROWD, "a virtual host costs a few hundred bytes"
    domains = [d for host in held[types.ROUTE]["9080"].virtual_hosts for d in host.domains]
    assert len(domains) == len(set(domains)), "no domain twice"
    assert "reviews" not in domains, "a short name two namespaces use names neither"
    assert "reviews.other" in domains
    assert not any(d.endswith(":9080") for d in domains), "the port is ignored, as istiod"
    assert held[types.ROUTE]["9080"].ignore_port_in_host_matching
    reviews = held[types.CLUSTER]["outbound|9080||reviews.default.svc.cluster.local"]
    assert [m.name for m in reviews.transport_socket_matches] == [
        "tlsMode-istio",
        "tlsMode-disabled",
    ], "a sidecar's clusters carry auto mTLS"
    path = tmp_path / "generated.pb"
    path.write_bytes(bootstrap_of(held).SerializeToString())
    validate_bootstrap(path)
