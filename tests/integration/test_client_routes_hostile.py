"""Routes that depend on the client, against clients and objects that push their luck.

- Thousands of Pods with distinct label sets, hundreds of them connected: sidecars
  matching the same `sourceLabels` selectors share one flavor, so the flavors held
  are the distinct selector sets in use (two here), not the label sets; each sidecar
  still gets its own routes, and the flavors go when the sidecars do.
- A node id claiming another namespace reads what its proven identity (its node
  metadata under `--xds-auth none`) gives, and a stream that proved none reads the
  shared routes, whatever namespace its node id names: neither gets a namespace's
  private routes by naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envoy.config.route.v3 import route_pb2

from pilot.xds import types
from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, endpoint_slice, pod, service
from tests.support.pilot import running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

HOST = "reviews.shop.svc.cluster.local"
TIMEOUT = 30.0
PODS = 3000
CONNECTED = 240
KINDS = ("tester", "web", "other")


def to(subset: str) -> dict[str, Any]:
    return {"destination": {"host": HOST, "subset": subset}}


def virtual_service(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def reviews() -> list[dict[str, Any]]:
    return [
        service("reviews", "shop", [("http", 9080)]),
        endpoint_slice("reviews", [Ep("10.44.1.1")], "shop", [("http", 9080)]),
    ]


def client_ip(i: int) -> str:
    return f"10.45.{i // 250}.{i % 250 + 1}"


def client_pods() -> list[dict[str, Any]]:
    """PODS pods in shop, each with labels no other has (an id, a hash, a kind)."""
    found = []
    for i in range(PODS):
        labels = {"app": KINDS[i % 3], "pod-id": str(i), "hash": f"{i * 7919:x}"}
        found.append(pod(f"c-{i}", client_ip(i), "shop", service_account="c", labels=labels))
    return found


async def route_config(stream: DeltaStream) -> route_pb2.RouteConfiguration:
    await stream.subscribe(types.ROUTE, ["9080"])
    while True:
        response = await stream.next_response(TIMEOUT)
        await stream.ack(response)
        got = delta_resources(response)
        if "9080" in got:
            config: route_pb2.RouteConfiguration = got["9080"].message
            return config


def subsets(config: route_pb2.RouteConfiguration) -> list[str]:
    [vhost] = [h for h in config.virtual_hosts if h.name == f"{HOST}:9080"]
    return [r.route.cluster.split("|")[2] for r in vhost.routes]


def sidecar_node(ip: str, node_namespace: str, metadata: dict[str, str] | None) -> Any:
    return node(f"sidecar~{ip}~c.{node_namespace}~{node_namespace}.svc.cluster.local", metadata)


async def test_thousands_of_label_sets_share_a_flavor_per_selector_set(tmp_path: Path) -> None:
    spec = {
        "hosts": ["reviews"],
        "http": [
            {"match": [{"sourceLabels": {"app": "tester"}}], "route": [to("v3")]},
            {"match": [{"sourceLabels": {"app": "web"}}], "route": [to("v2")]},
            {"route": [to("v1")]},
        ],
    }
    objects = [*reviews(), *client_pods(), virtual_service("reviews", "shop", spec)]
    expected = {"tester": ["v3", "v1"], "web": ["v2", "v1"], "other": ["v1"]}
    async with (
        running_pilot(tmp_path, objects) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        stats = pilot.discovery.stats
        meta = {"NAMESPACE": "shop", "SERVICE_ACCOUNT": "c"}
        streams = [
            client.delta_ads(sidecar_node(client_ip(i), "shop", meta)) for i in range(CONNECTED)
        ]
        for i, stream in enumerate(streams):
            assert subsets(await route_config(stream)) == expected[KINDS[i % 3]], i
        assert stats.route_flavors == 2  # tester's and web's: 240 sidecars, 240 label sets
        for stream in streams:
            await stream.close()
        await wait_until(lambda: stats.route_flavors == 0, TIMEOUT, "the flavors dropped")


async def test_a_claimed_namespace_reads_nothing_of_that_namespace(tmp_path: Path) -> None:
    private = {"hosts": [HOST], "exportTo": ["."], "http": [{"route": [to("v3")]}]}
    objects = [*reviews(), virtual_service("front-only", "front", private)]
    async with (
        running_pilot(tmp_path, objects) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        front = sidecar_node("10.46.0.1", "front", {"NAMESPACE": "front", "SERVICE_ACCOUNT": "a"})
        # Proves shop (its metadata, under --xds-auth none), names front in its node id.
        claimer = sidecar_node("10.46.0.2", "front", {"NAMESPACE": "shop", "SERVICE_ACCOUNT": "a"})
        unproven = sidecar_node("10.46.0.3", "front", None)  # proves nothing
        assert subsets(await route_config(client.delta_ads(front))) == ["v3"]
        assert subsets(await route_config(client.delta_ads(claimer))) == [""]
        assert subsets(await route_config(client.delta_ads(unproven))) == [""]
        assert pilot.discovery.stats.route_flavors == 1
