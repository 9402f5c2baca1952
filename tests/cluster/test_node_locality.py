"""A real Envoy gets endpoints in priorities by proximity, from Nodes' topology labels.

Three Nodes labelled as a cloud labels them (topology.kubernetes.io/region and /zone:
eu/a, eu/b, us/c) and a Pod of `shop` on each, run there by the test kubelet; the real
EndpointSlice controller names each endpoint's Node and zone. As Istio, pilot fails
over by locality only where a DestinationRule sets outlier detection: before one, an
Envoy declaring eu/a holds all three hosts at priority 0; with one, eu/a at 0, eu/b at
1, us/c at 2, and an Envoy declaring no locality all three at 0. The us Node relabelled
into region eu moves its host to priority 1 (same region, another zone). The Nodes are
the test's and removed after it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from tests.cluster.client import Kube, admin, path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.envoy_hosts import running_envoy
from tests.cluster.kubelet import ensure_node
from tests.cluster.workloads import (
    SERVICE_PORT,
    Kubelet,
    address,
    ensure_account,
    pod,
    service,
    watching_pilot,
)
from tests.support.envoy_process import EnvoyProcess, wait_until
from tests.support.envoy_view import host_priorities
from tests.support.mesh import cluster_name

REGION, ZONE = "topology.kubernetes.io/region", "topology.kubernetes.io/zone"
PLACES = {"eu-a": ("eu", "a"), "eu-b": ("eu", "b"), "us-c": ("us", "c")}
TIMEOUT = 20.0
FAILOVER = {  # outlier detection: Istio's locality failover on
    "apiVersion": "networking.istio.io/v1",
    "kind": "DestinationRule",
    "spec": {"host": "shop", "trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 5}}},
}


@asynccontextmanager
async def labelled_nodes(kube: Kube, prefix: str) -> AsyncIterator[dict[str, str]]:
    """A Node per place (place -> its name), deleted afterwards."""
    names = {place: f"{prefix}-{place}" for place in PLACES}
    try:
        for place, (region, zone) in PLACES.items():
            await ensure_node(kube, names[place], {REGION: region, ZONE: zone})
        yield names
    finally:
        for name in names.values():
            await kube.delete({"kind": "Node", "metadata": {"name": name}})


async def wait_priorities(
    envoy: EnvoyProcess, cluster: str, expected: dict[str, int], what: str
) -> None:
    await wait_until(
        lambda: host_priorities(envoy, cluster), TIMEOUT, what,
        until=lambda seen: seen == expected,
    )  # fmt: skip


async def test_envoy_host_priorities_follow_node_topology(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    shop = cluster_name("shop", SERVICE_PORT, namespace)
    async with AsyncExitStack() as stack:
        kube = await stack.enter_async_context(admin(deployed))
        nodes = await stack.enter_async_context(labelled_nodes(kube, namespace))
        await ensure_account(kube, namespace)
        await kube.create(service("shop", namespace))
        kubelet = Kubelet(kube, namespace)
        ips = {
            place: address(await kubelet.run(pod(f"shop-{place}", namespace, "shop"), node))
            for place, node in nodes.items()
        }
        pilot = await stack.enter_async_context(
            watching_pilot(kube, deployed, tmp_path, (namespace,))
        )
        near = await stack.enter_async_context(
            running_envoy(pilot, tmp_path, "envoy-ads-delta.yaml", "eu-a",
                          {"region": "eu", "zone": "a"})
        )  # fmt: skip
        nowhere = await stack.enter_async_context(
            running_envoy(pilot, tmp_path, "envoy-ads-delta.yaml", "nowhere")
        )
        await wait_priorities(near, shop, dict.fromkeys(ips.values(), 0), "no rule: all 0")
        await kube.create(FAILOVER | {"metadata": {"name": "shop", "namespace": namespace}})
        await wait_priorities(
            near, shop, {ips["eu-a"]: 0, ips["eu-b"]: 1, ips["us-c"]: 2},
            "same zone 0, same region 1, elsewhere 2",
        )  # fmt: skip
        await wait_priorities(nowhere, shop, dict.fromkeys(ips.values(), 0), "no locality: all 0")

        moved = {"metadata": {"labels": {REGION: "eu", ZONE: "b"}}}
        await kube.merge_patch(path_of("Node", name=nodes["us-c"]), moved)
        await wait_priorities(
            near, shop, {ips["eu-a"]: 0, ips["eu-b"]: 1, ips["us-c"]: 1}, "a relabelled Node"
        )
