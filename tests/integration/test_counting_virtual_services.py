"""VirtualServices from the registry file, counted: what each change sends, to whom.

Bookinfo's reviews (9080, pods v1, v2, v3, a DestinationRule of those subsets) and
ratings (8080), with a VirtualService splitting reviews 50/50 over v1 and v3. Three
sidecars on delta ADS read clusters, their assignments and listeners as Envoy does;
two hold route configuration 9080, the third only 8080. Shifting the weights to
80/20 sends route configuration 9080 to the two that hold it, one response each,
and nothing else to anyone (no cluster, assignment or listener, nothing to the
third); an endpoint change sends assignments alone, never a route. A version of the
file whose VirtualService is invalid keeps its last good routes (nothing is sent)
and is one warning naming it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from pilot.xds import types
from tests.integration.reviews_counting import (
    HOST,
    TIMEOUT,
    cluster,
    follow,
    read_one,
    reviews,
    reviews_routes,
    reviews_subsets,
)
from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import responses_written, running_pilot
from tests.support.xds_client import XdsClient, node

SIDECARS = {"10.44.0.7": ["9080", "8080"], "10.44.0.8": ["9080"], "10.44.0.9": ["8080"]}


def split(v1: int, v3: int) -> dict[str, Any]:
    def to(subset: str, weight: int) -> dict[str, Any]:
        return {"destination": {"host": "reviews", "subset": subset}, "weight": weight}

    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "reviews", "namespace": "shop"},
        "spec": {"hosts": ["reviews"], "http": [{"route": [to("v1", v1), to("v3", v3)]}]},
    }


def mesh(*virtual_services: dict[str, Any], unready: str = "") -> list[dict[str, Any]]:
    return [
        *reviews(unready),
        service("ratings", "shop", [("http", 8080)]),
        endpoint_slice("ratings", [Ep("10.44.3.1")], "shop", [("http", 8080)]),
        reviews_subsets(),
        *virtual_services,
    ]


def weights(held: dict[str, dict[str, Any]]) -> dict[str, int]:
    routes = reviews_routes(held)
    return {c.name: c.weight.value for c in routes[0].route.weighted_clusters.clusters}


async def test_a_weight_change_pushes_rds_alone_to_the_sidecars_holding_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        running_pilot(tmp_path, mesh(split(50, 50))) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        streams = {
            ip: client.delta_ads(node(f"sidecar~{ip}~x.shop~shop.svc.cluster.local"))
            for ip in SIDECARS
        }
        held = {ip: await follow(streams[ip], routes) for ip, routes in SIDECARS.items()}
        assert weights(held["10.44.0.7"]) == {cluster("v1"): 50, cluster("v3"): 50}
        stats = pilot.discovery.stats

        # 80/20: route configuration 9080 to its two holders, nothing else to anyone.
        stats.reset()
        pilot.write(mesh(split(80, 20)))
        for ip in ("10.44.0.7", "10.44.0.8"):
            assert await read_one(streams[ip], held[ip]) == (types.ROUTE, {"9080"})
            assert weights(held[ip]) == {cluster("v1"): 80, cluster("v3"): 20}
        await responses_written(stats, {types.ROUTE: 2})

        # An endpoint not ready: assignments alone (the subset's and the service's).
        stats.reset()
        pilot.write(mesh(split(80, 20), unready="10.44.1.1"))
        for ip in SIDECARS:
            kind, names = await read_one(streams[ip], held[ip])
            assert (kind, names) == (types.ENDPOINT, {cluster("v1"), f"outbound|9080||{HOST}"})
        await responses_written(stats, {types.ENDPOINT: 3})

        # A broken version: one warning naming it, nothing sent (the 80/20 keeps serving);
        # the next good version is the next thing each holder gets.
        caplog.set_level(logging.WARNING, "pilot.sources.file")
        broken = split(10, 90)
        broken["spec"]["http"][0]["match"] = [{"uri": {"regex": "(?=lookahead)"}}]
        stats.reset()
        pilot.write(mesh(broken, unready="10.44.1.1"))
        await _until_warned(caplog)
        pilot.write(mesh(split(30, 70), unready="10.44.1.1"))
        for ip in ("10.44.0.7", "10.44.0.8"):
            assert await read_one(streams[ip], held[ip]) == (types.ROUTE, {"9080"})
            assert weights(held[ip]) == {cluster("v1"): 30, cluster("v3"): 70}
        await responses_written(stats, {types.ROUTE: 2})
        warned = [r.getMessage() for r in caplog.records if "VirtualService" in r.getMessage()]
        assert len(warned) == 1 and "shop/reviews" in warned[0], warned
        assert "spec.http[0].match[0].uri.regex" in warned[0]


async def _until_warned(caplog: pytest.LogCaptureFixture) -> None:
    await wait_until(
        lambda: any("VirtualService" in r.getMessage() for r in caplog.records),
        TIMEOUT,
        "the warning naming the broken VirtualService",
    )
