"""DestinationRule and VirtualService through Istio's CRDs on the real API server.

A sidecar of the test's namespace (an xDS stream whose node is the namespace's running
Pod) holds reviews' clusters. A DestinationRule created through the CRD
(networking.istio.io/v1, as Istio installs it) adds the subset's cluster without a
restart; its assignment holds the pod once the pod carries the subset's label, and
loses it when the label goes. What the CRD's schema admits and pilot refuses (a
trafficPolicy field pilot does not build; a VirtualService regex Envoy's RE2 would
refuse) is counted (`pilot_config_rejected_total{kind}`) and changes nothing: the
last good version keeps serving. A Gateway is only listed (/debug/configz). Deleted,
the rule takes its subset's cluster with it. All of it as pilot's ServiceAccount,
with exactly deploy/rbac.yaml's grants.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp

from pilot.xds import types
from tests.cluster.client import path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.workloads import (
    SERVICE_PORT,
    address,
    per_kind,
    reviews_sidecar,
)
from tests.support.envoy_process import wait_until
from tests.support.mesh import istio_object
from tests.support.xds_client import DeltaStream, delta_resources, endpoint_ips

TIMEOUT = 30.0


class Held:
    """What one delta stream holds of clusters and assignments, read as Envoy reads."""

    def __init__(self, stream: DeltaStream) -> None:
        self.stream = stream
        self.types: dict[str, dict[str, Any]] = {types.CLUSTER: {}, types.ENDPOINT: {}}

    async def until(self, done: Any) -> None:
        while not done(self):
            response = await self.stream.next_response(TIMEOUT)
            got = delta_resources(response)
            table = self.types[response.type_url]
            for name, resource in got.items():
                table[name] = resource.message
            for name in response.removed_resources:
                table.pop(name, None)
            await self.stream.ack(response)
            if response.type_url == types.CLUSTER and got:
                await self.stream.subscribe(types.ENDPOINT, sorted(got))

    def ips(self, name: str) -> set[str] | None:
        assignment = self.types[types.ENDPOINT].get(name)
        return None if assignment is None else endpoint_ips(assignment)


async def configz(port: int) -> Any:
    url = f"http://127.0.0.1:{port}/debug/configz"
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        return json.loads(await answer.text())


async def test_destination_rule_from_the_crd_reaches_clusters_and_endpoints(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    host = f"reviews.{namespace}.svc.cluster.local"
    v1 = f"outbound|{SERVICE_PORT}|v1|{host}"
    async with AsyncExitStack() as stack:
        kube, pod, pilot, stream = await reviews_sidecar(stack, deployed, namespace, tmp_path)
        name = pod["metadata"]["name"]
        await stream.subscribe(types.CLUSTER, ["*"])
        held = Held(stream)
        await held.until(lambda h: f"outbound|{SERVICE_PORT}||{host}" in h.types[types.CLUSTER])

        rule = await kube.create(
            istio_object(
                "DestinationRule",
                "reviews",
                namespace,
                {
                    "host": "reviews",
                    "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 1}}},
                    "subsets": [{"name": "v1", "labels": {"version": "v1"}}],
                },
            )
        )
        await held.until(lambda h: h.ips(v1) == set())  # no pod has the label yet
        pod_path = path_of("Pod", namespace, name)
        await kube.merge_patch(pod_path, {"metadata": {"labels": {"version": "v1"}}})
        await held.until(lambda h: h.ips(v1) == {address(pod)})

        # Admitted by the schema, refused by pilot: counted, and nothing changes.
        await kube.create(
            istio_object(
                "DestinationRule",
                "tunnel",
                namespace,
                {
                    "host": "reviews",
                    "trafficPolicy": {
                        "tunnel": {"protocol": "CONNECT", "targetHost": "x", "targetPort": 1}
                    },
                },
            )
        )
        await kube.create(
            istio_object(
                "VirtualService",
                "lookahead",
                namespace,
                {
                    "hosts": ["reviews"],
                    "http": [
                        {
                            "match": [{"uri": {"regex": "/(?=v1)"}}],
                            "route": [{"destination": {"host": "reviews", "subset": "v1"}}],
                        }
                    ],
                },
            )
        )
        await kube.create(
            istio_object(
                "Gateway",
                "bookinfo",
                namespace,
                {
                    "selector": {"istio": "ingressgateway"},
                    "servers": [
                        {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}
                    ],
                },
            )
        )
        await wait_until(
            lambda: per_kind(pilot, "pilot_config_rejected"),
            TIMEOUT,
            "the refused counted",
            until=lambda seen: seen["DestinationRule"] >= 1 and seen["VirtualService"] >= 1,
        )
        await wait_until(
            lambda: configz(pilot.http_port),
            TIMEOUT,
            "the Gateway listed",
            until=lambda z: [u["kind"] for u in z["unsupported"]] == ["Gateway"],
        )
        assert held.ips(v1) == {address(pod)}

        await kube.merge_patch(pod_path, {"metadata": {"labels": {"version": "v2"}}})
        await held.until(lambda h: h.ips(v1) == set())
        await kube.delete(rule)
        await held.until(lambda h: v1 not in h.types[types.CLUSTER])
