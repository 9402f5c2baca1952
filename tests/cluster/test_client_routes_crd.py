"""Routes that depend on the client, through Istio's CRD on the real API server.

The test's namespace runs one `reviews` replica (the test kubelet). Two xDS streams
speak as that Pod's sidecar: one proves its namespace and service account (node
metadata, which the test pilot trusts as `--xds-auth none` does), one proves nothing.
A VirtualService created through the CRD, exported to its own namespace alone, sends
Pods labelled `track: canary` to v2 and the rest to v1: the proven sidecar gets v1
(its namespace's flavor), the one that proved nothing keeps the shared default route.
Labelling the Pod `track: canary` through the API server moves the proven sidecar to
v2 then v1, without a restart; the VirtualService deleted, it reads the default route
again.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from envoy.config.route.v3 import route_pb2

from pilot.xds import types
from tests.cluster.client import path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.workloads import SERVICE_PORT, address, reviews_sidecar, service
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

TIMEOUT = 30.0
ROUTE = str(SERVICE_PORT)


def private_routes(namespace: str) -> dict[str, Any]:
    def to(subset: str) -> dict[str, Any]:
        return {"destination": {"host": "reviews", "subset": subset}}

    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "reviews", "namespace": namespace},
        "spec": {
            "hosts": ["reviews"],
            "exportTo": ["."],
            "http": [
                {"match": [{"sourceLabels": {"track": "canary"}}], "route": [to("v2")]},
                {"route": [to("v1")]},
            ],
        },
    }


async def reviews_route(stream: DeltaStream, host: str, until: Any) -> list[str]:
    """Read route configuration ROUTE as it comes, until the subsets of reviews' routes
    ("" for the service's own cluster) satisfy `until`."""
    while True:
        response = await stream.next_response(TIMEOUT)
        await stream.ack(response)
        config = delta_resources(response).get(ROUTE)
        if response.type_url != types.ROUTE or config is None:
            continue
        assert isinstance(config.message, route_pb2.RouteConfiguration)
        [vhost] = [v for v in config.message.virtual_hosts if v.name == f"{host}:{ROUTE}"]
        subsets = [r.route.cluster.split("|")[2] for r in vhost.routes]
        if until(subsets):
            return subsets


async def test_a_private_source_labels_route_from_the_crd_follows_the_pod(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    host = f"reviews.{namespace}.svc.cluster.local"
    async with AsyncExitStack() as stack:
        kube, pod, pilot, unproven = await reviews_sidecar(stack, deployed, namespace, tmp_path)
        name = pod["metadata"]["name"]
        node_id = f"sidecar~{address(pod)}~{name}.{namespace}~{namespace}.svc.cluster.local"
        account = pod["spec"].get("serviceAccountName", "default")
        client = await stack.enter_async_context(XdsClient(pilot.grpc_target))
        proven = client.delta_ads(
            node(node_id, {"NAMESPACE": namespace, "SERVICE_ACCOUNT": account})
        )
        for stream in (proven, unproven):
            await stream.subscribe(types.ROUTE, [ROUTE])
            assert await reviews_route(stream, host, lambda s: len(s) == 1) == [""]

        await kube.create(private_routes(namespace))
        assert await reviews_route(proven, host, lambda s: s != [""]) == ["v1"]

        labels = {"metadata": {"labels": {"track": "canary"}}}
        await kube.merge_patch(path_of("Pod", namespace, name), labels)
        assert await reviews_route(proven, host, lambda s: s != ["v1"]) == ["v2", "v1"]

        await kube.delete(private_routes(namespace))
        assert await reviews_route(proven, host, lambda s: s != ["v2", "v1"]) == [""]
        # The stream that proved nothing never read the private routes: its next
        # configuration (a new service on the port) is still the default one.
        await kube.create(service("ratings", namespace))
        assert await reviews_route(unproven, host, lambda s: True) == [""]
