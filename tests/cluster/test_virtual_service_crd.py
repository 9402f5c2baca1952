"""A VirtualService through Istio's CRD on the real API server reaches the sidecar's routes.

A sidecar of the test's namespace (an xDS stream whose node is the namespace's running
Pod) holds route configuration 80, with reviews' default route. A VirtualService
created through the CRD (networking.istio.io/v1, as Istio installs it) splitting
reviews 50/50 over two subsets replaces that route with the weighted subset clusters,
without a restart; patched to 80/20 it sends the new weights, and deleted it gives
the default route back. All of it as pilot's ServiceAccount, with exactly
deploy/rbac.yaml's grants.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from envoy.config.route.v3 import route_pb2

from pilot.xds import types
from tests.cluster.client import path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.workloads import (
    SERVICE_PORT,
    reviews_sidecar,
)
from tests.support.xds_client import DeltaStream, delta_resources

TIMEOUT = 30.0
ROUTE = str(SERVICE_PORT)


def split(namespace: str, v1: int, v2: int) -> dict[str, Any]:
    def to(subset: str, weight: int) -> dict[str, Any]:
        return {"destination": {"host": "reviews", "subset": subset}, "weight": weight}

    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "reviews", "namespace": namespace},
        "spec": {"hosts": ["reviews"], "http": [{"route": [to("v1", v1), to("v2", v2)]}]},
    }


async def reviews_route(stream: DeltaStream, host: str, until: Any) -> list[Any]:
    """Read route configuration ROUTE as it comes, until reviews' routes satisfy `until`."""
    while True:
        response = await stream.next_response(TIMEOUT)
        await stream.ack(response)
        config = delta_resources(response).get(ROUTE)
        if response.type_url != types.ROUTE or config is None:
            continue
        assert isinstance(config.message, route_pb2.RouteConfiguration)
        [vhost] = [v for v in config.message.virtual_hosts if v.name == f"{host}:{ROUTE}"]
        routes = list(vhost.routes)
        if until(routes):
            return routes


def weights(routes: list[Any]) -> dict[str, int]:
    return {c.name: c.weight.value for c in routes[0].route.weighted_clusters.clusters}


async def test_a_virtual_service_from_the_crd_reaches_the_route_configuration(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    host = f"reviews.{namespace}.svc.cluster.local"
    subset = {v: f"outbound|{SERVICE_PORT}|{v}|{host}" for v in ("v1", "v2")}
    async with AsyncExitStack() as stack:
        kube, _, _, stream = await reviews_sidecar(stack, deployed, namespace, tmp_path)
        await stream.subscribe(types.ROUTE, [ROUTE])
        default = await reviews_route(stream, host, lambda r: len(r) == 1)
        assert default[0].name == "default"

        await kube.create(split(namespace, 50, 50))
        routes = await reviews_route(stream, host, lambda r: r[0].name != "default")
        assert weights(routes) == {subset["v1"]: 50, subset["v2"]: 50}

        path = path_of("VirtualService", namespace, "reviews")
        patch = {"spec": split(namespace, 80, 20)["spec"]}
        await kube.merge_patch(path, patch)
        routes = await reviews_route(stream, host, lambda r: weights(r).get(subset["v1"]) == 80)
        assert weights(routes) == {subset["v1"]: 80, subset["v2"]: 20}

        await kube.delete(split(namespace, 80, 20))
        routes = await reviews_route(stream, host, lambda r: r[0].name == "default")
        assert routes[0].route.cluster == f"outbound|{SERVICE_PORT}||{host}"
