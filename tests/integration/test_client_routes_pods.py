"""Routes that depend on the client, followed by real Envoys with real backends.

The pods of tests/integration/client_pods.py: web and tester (namespace default) and
front (namespace front) call reviews (default), whose pods v1, v2 and v3 answer with
their version. Each test writes the registry file with the reviews DestinationRule
of istio.io's bookinfo samples and its VirtualServices, waits for each client's Envoy
to hold its own routes, and sends real requests: `sourceNamespace` and `sourceLabels`
send different clients to different versions, a VirtualService exported to its own
namespace routes that namespace's clients alone, and one written in front for
default's reviews routes front's client and not default's own. After each, no Envoy
has rejected anything.
"""

from __future__ import annotations

import pytest

from tests.integration.client_pods import (
    REVIEWS_HOST,
    SUBSETS,
    ClientMesh,
    module_client_pods,
    nothing_rejected,
    only,
    spread,
    to,
    virtual_service,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

mesh = module_client_pods("client-routes")


async def test_source_namespace_and_source_labels_pick_each_clients_version(
    mesh: ClientMesh,
) -> None:
    spec = {
        "hosts": ["reviews"],
        "http": [
            {"match": [{"sourceNamespace": "front"}], "route": [to("v2")]},
            {"match": [{"sourceLabels": {"app": "tester"}}], "route": [to("v3")]},
            {"route": [to("v1")]},
        ],
    }
    mesh.apply(SUBSETS, virtual_service("reviews", "default", spec))
    await mesh.wait_clusters("front", ["v2", "v1"])
    await mesh.wait_clusters("tester", ["v3", "v1"])
    await mesh.wait_clusters("web", ["v1"])
    await only(mesh, "front", "v2")
    await only(mesh, "tester", "v3")
    await only(mesh, "web", "v1")
    # proxy-config shows each sidecar its own routes.
    for client, expected in (("tester", ["v3", "v1"]), ("web", ["v1"]), ("front", ["v2", "v1"])):
        rows = await mesh.proxy_config_routes(client)
        shown = [r["destination"] for r in rows if r["vhost_name"] == f"{REVIEWS_HOST}:9080"]
        assert shown == [f"Cluster: outbound|9080|{v}|{REVIEWS_HOST}" for v in expected]

    # web relabelled a tester: it moves to the testers' routes.
    mesh.apply(
        SUBSETS, virtual_service("reviews", "default", spec), labels={"web": {"app": "tester"}}
    )
    await mesh.wait_clusters("web", ["v3", "v1"])
    await only(mesh, "web", "v3")
    await nothing_rejected(mesh)


async def test_exported_to_its_own_namespace_routes_that_namespace_alone(
    mesh: ClientMesh,
) -> None:
    private = {"hosts": ["reviews"], "exportTo": ["."], "http": [{"route": [to("v2")]}]}
    mesh.apply(SUBSETS, virtual_service("reviews", "default", private))
    await mesh.wait_clusters("web", ["v2"])
    await mesh.wait_clusters("tester", ["v2"])
    await mesh.wait_clusters("front", [""])  # front does not see it: the default route
    await only(mesh, "web", "v2")
    await only(mesh, "tester", "v2")
    await spread(mesh, "front")
    await nothing_rejected(mesh)


async def test_one_written_in_front_for_defaults_reviews_routes_front_alone(
    mesh: ClientMesh,
) -> None:
    # Written in front, short names would be front's: the host and destination are FQDNs.
    foreign = {"hosts": [REVIEWS_HOST], "http": [{"route": [to("v3", REVIEWS_HOST)]}]}
    mesh.apply(SUBSETS, virtual_service("reviews-for-front", "front", foreign))
    await mesh.wait_clusters("front", ["v3"])
    await mesh.wait_clusters("web", [""])
    await only(mesh, "front", "v3")
    await spread(mesh, "web")
    await spread(mesh, "tester")
    await nothing_rejected(mesh)
