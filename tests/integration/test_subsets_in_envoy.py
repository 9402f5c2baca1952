"""A real Envoy holds a DestinationRule's subsets: each subset cluster has only its pods.

`pilot discovery --config FILE` (a subprocess) serves an Envoy started from the
example delta ADS bootstrap. The file has bookinfo's reviews with a pod per version
(v1, v2, v3) and istio.io's DestinationRule for it, with a circuit breaker on v2.
Envoy's /clusters shows `outbound|9080|v1|...` with the v1 pod alone (and so on),
the service's own cluster with all three, the circuit breaker as Envoy's thresholds,
and no CDS update rejected; `pilot proxy-config clusters` shows each subset and its
policy. When the v3 pod is relabelled v2 in the file, Envoy's v2 cluster holds both
and v3 none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_pilot
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap, wait_until
from tests.support.mesh import Ep, endpoint_slice, pod, service, write_mesh
from tests.support.pilot_process import start_file_pilot_with_ca
from tests.support.proxies import Proxy

pytestmark = [pytest.mark.envoy]

PROXY = Proxy.sidecar("productpage-1", "shop", "productpage")
HOST = "reviews.shop.svc.cluster.local"
TIMEOUT = 30.0


def cluster(subset: str) -> str:
    return f"outbound|9080|{subset}|{HOST}"


def mesh(labels: dict[str, str]) -> list[dict[str, Any]]:
    """reviews with a pod per address, labelled `labels[ip]`, and its DestinationRule."""
    return [
        service("reviews", "shop", [("http", 9080)]),
        endpoint_slice(
            "reviews",
            [Ep(ip, pod=f"reviews-{i}") for i, ip in enumerate(labels)],
            "shop",
            [("http", 9080)],
        ),
        *(
            pod(f"reviews-{i}", ip, "shop", labels={"version": v})
            for i, (ip, v) in enumerate(labels.items())
        ),
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "reviews", "namespace": "shop"},
            "spec": {
                "host": "reviews",
                "subsets": [
                    {"name": "v1", "labels": {"version": "v1"}},
                    {
                        "name": "v2",
                        "labels": {"version": "v2"},
                        "trafficPolicy": {
                            "connectionPool": {
                                "tcp": {"maxConnections": 1},
                                "http": {"http1MaxPendingRequests": 1},
                            }
                        },
                    },
                    {"name": "v3", "labels": {"version": "v3"}},
                ],
            },
        },
    ]


VERSIONS = {"127.0.5.1": "v1", "127.0.5.2": "v2", "127.0.5.3": "v3"}


async def hosts(envoy: EnvoyProcess) -> dict[str, set[str]]:
    """Envoy's /clusters: each reviews cluster's host addresses."""
    found: dict[str, set[str]] = {}
    for status in (await envoy.clusters()).get("cluster_statuses", []):
        if HOST in status["name"]:
            addresses = {
                h["address"]["socket_address"]["address"] for h in status.get("host_statuses", [])
            }
            found[status["name"]] = addresses
    return found


def thresholds(clusters: dict[str, Any], name: str) -> dict[str, Any]:
    for status in clusters.get("cluster_statuses", []):
        if status["name"] == name:
            return dict(status["circuit_breakers"]["thresholds"][0])
    return {}


async def test_each_subset_cluster_holds_its_pods_only(tmp_path: Path) -> None:
    config = tmp_path / "mesh.yaml"
    write_mesh(config, mesh(VERSIONS))
    pilot = await start_file_pilot_with_ca(tmp_path, config)
    try:
        bootstrap = load_example_bootstrap(
            "envoy-ads-delta.yaml", pilot.grpc_port, PROXY.node_id, PROXY.metadata
        )
        async with EnvoyProcess(bootstrap, tmp_path / "envoy", "subsets") as envoy:
            expected = {
                cluster(""): set(VERSIONS),
                **{cluster(v): {ip} for ip, v in VERSIONS.items()},
            }
            await wait_until(lambda: hosts(envoy), TIMEOUT, "subsets", until=expected.__eq__)
            assert await envoy.stat("cluster_manager.cds.update_rejected") == 0
            assert await envoy.stat("cluster_manager.cds.update_success") not in (None, 0)
            limits = thresholds(await envoy.clusters(), cluster("v2"))
            assert (limits["max_connections"], limits["max_pending_requests"]) == (1, 1)

            shown = await run_pilot(
                "proxy-config",
                "clusters",
                PROXY.node_id,
                "--addr",
                pilot.target(tls=False),
                "-o",
                "json",
            )
            rows = {r["name"]: r for r in shown.records() if HOST in r["name"]}
            assert {r["subset"] for r in rows.values()} == {None, "v1", "v2", "v3"}
            assert "maxConnections=1; maxPending=1" in rows[cluster("v2")]["policy"]

            write_mesh(config, mesh({**VERSIONS, "127.0.5.3": "v2"}))
            moved = {**expected, cluster("v2"): {"127.0.5.2", "127.0.5.3"}, cluster("v3"): set()}
            await wait_until(lambda: hosts(envoy), TIMEOUT, "v3 in v2", until=moved.__eq__)
            assert await envoy.stat("cluster_manager.cds.update_rejected") == 0
    finally:
        await pilot.stop()
