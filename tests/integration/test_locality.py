"""A real Envoy gets endpoints in priorities by proximity to the locality it declares.

Endpoints in three localities, given by the Nodes they run on (topology labels
on Nodes in the test API server, nodeName on the EndpointSlice): an Envoy in
eu/a must hold the eu/a host at priority 0, the eu/b host at 1 and the us/c
host at 2, in its own /clusters; an Envoy that declares no locality holds all
at 0. Relabelling a Node moves its endpoint's priority. Nodes are read as metadata
only.
"""

from __future__ import annotations

from pathlib import Path

from tests.harness.envoy_process import EnvoyProcess, load_example_bootstrap, wait_until
from tests.integration.envoy_view import host_priorities
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.mesh import Ep, cluster_name, endpoint_slice, node, service
from tests.support.pilot import running_kube_pilot

SHOP = cluster_name("shop")
HOSTS = {"127.0.7.1": "n-eu-a", "127.0.7.2": "n-eu-b", "127.0.7.3": "n-us-c"}
NODES = {"n-eu-a": ("eu", "a"), "n-eu-b": ("eu", "b"), "n-us-c": ("us", "c")}


def _envoy(
    grpc_port: int, workdir: Path, name: str, locality: dict[str, str] | None
) -> EnvoyProcess:
    bootstrap = load_example_bootstrap("envoy-ads-delta.yaml", grpc_port, name)
    if locality is not None:
        bootstrap["node"]["locality"] = locality
    (workdir / name).mkdir()
    return EnvoyProcess(bootstrap, workdir / name, name, log_level="warning")


async def _wait_priorities(envoy: EnvoyProcess, expected: dict[str, int], what: str) -> None:
    await wait_until(
        lambda: host_priorities(envoy, SHOP), 20, what, until=lambda seen: seen == expected
    )


async def test_envoy_host_priorities_follow_proximity(tmp_path: Path) -> None:
    async with KubeAPIServer() as api:
        for name, (region, zone) in NODES.items():
            api.apply(node(name, region, zone))
        api.apply(service("shop"))
        api.apply(endpoint_slice("shop", [Ep(ip, node=on) for ip, on in HOSTS.items()]))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        async with (
            running_kube_pilot(kubeconfig) as pilot,
            _envoy(pilot.grpc_port, tmp_path, "eu-a", {"region": "eu", "zone": "a"}) as near,
            _envoy(pilot.grpc_port, tmp_path, "nowhere", None) as nowhere,
        ):
            await _wait_priorities(
                near,
                {"127.0.7.1": 0, "127.0.7.2": 1, "127.0.7.3": 2},
                "same zone 0, same region 1, elsewhere 2",
            )
            await _wait_priorities(nowhere, dict.fromkeys(HOSTS, 0), "no locality: all 0")

            api.apply(node("n-us-c", "eu", "b"))  # the us node moves next door
            await _wait_priorities(
                near, {"127.0.7.1": 0, "127.0.7.2": 1, "127.0.7.3": 1}, "a relabelled Node"
            )
        node_reads = api.requests_for("Node")
        assert node_reads, "pilot lists and watches Nodes"
        assert all("as=PartialObjectMetadata" in r.accept for r in node_reads), (
            "Nodes are read as metadata only: pilot keeps two labels of them"
        )
