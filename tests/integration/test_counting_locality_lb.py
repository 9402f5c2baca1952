"""A DestinationRule's localityLbSetting changed, counted: what each change sends, to whom.

reviews and productpage, each with an endpoint in zone-a and one in zone-b; reviews has
a DestinationRule with outlier detection (locality failover). Two sidecars in zone-a
on delta ADS follow clusters and assignments as Envoy does. Adding `distribute` to the
rule changes reviews' cluster (locality-weighted balancing) and its assignment
(weights): one CDS response with that cluster alone and one EDS response with that
assignment alone, per sidecar; productpage's are not sent. Changing the weights sends
the assignment alone. A version whose weights do not sum to 100 sends nothing, is one
warning naming the rule and counted, and the last good weights keep serving.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.xds import types
from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import responses_written, running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

SIDECARS = ("10.44.0.7", "10.44.0.8")
REVIEWS = "outbound|9080||reviews.shop.svc.cluster.local"
PAGE = "outbound|9080||productpage.shop.svc.cluster.local"
OUTLIERS = {"outlierDetection": {"consecutive5xxErrors": 5}}
TIMEOUT = 30.0


async def follow(stream: DeltaStream, until: set[str]) -> dict[str, dict[str, Any]]:
    """Read as Envoy does (clusters, then the assignments of each cluster held) until the
    stream holds every one of `until`, as clusters and assignments."""
    held: dict[str, dict[str, Any]] = {types.CLUSTER: {}, types.ENDPOINT: {}}
    await stream.subscribe(types.CLUSTER, ["*"])
    while not (until <= held[types.CLUSTER].keys() and until <= held[types.ENDPOINT].keys()):
        await read_one(stream, held)
    return held


async def read_one(stream: DeltaStream, held: dict[str, dict[str, Any]]) -> set[str]:
    """One response applied (and, for new clusters, their assignments asked for); the names
    it sent or removed."""
    response = await stream.next_response(TIMEOUT)
    got = delta_resources(response)
    for name, resource in got.items():
        held[response.type_url][name] = resource.message
    for name in response.removed_resources:
        held[response.type_url].pop(name, None)
    await stream.ack(response)
    if response.type_url == types.CLUSTER and got:
        await stream.subscribe(types.ENDPOINT, sorted(got.keys() - held[types.ENDPOINT].keys()))
    return set(got) | set(response.removed_resources)


async def http_get(port: int, path: str) -> str:
    """pilot runs in this test's loop: asked without blocking it."""
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as answer,
    ):
        return await answer.text()


def rule(to: dict[str, Any] | None) -> dict[str, Any]:
    policy: dict[str, Any] = dict(OUTLIERS)
    if to is not None:
        distribute = [{"from": "Kubernetes/zone-a", "to": to}]
        policy["loadBalancer"] = {"localityLbSetting": {"distribute": distribute}}
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "reviews", "namespace": "shop"},
        "spec": {"host": "reviews", "trafficPolicy": policy},
    }


def mesh(reviews_rule: dict[str, Any]) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for n, name in enumerate(("reviews", "productpage")):
        endpoints = [Ep(f"10.44.{n + 1}.1", zone="zone-a"), Ep(f"10.44.{n + 1}.2", zone="zone-b")]
        objects += [
            service(name, "shop", [("http", 9080)]),
            endpoint_slice(name, endpoints, "shop", [("http", 9080)]),
        ]
    return [*objects, reviews_rule]


def weights(assignment: endpoint_pb2.ClusterLoadAssignment) -> dict[str, int]:
    return {g.locality.zone: g.load_balancing_weight.value for g in assignment.endpoints}


async def test_a_locality_setting_change_sends_that_services_cluster_and_assignment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        running_pilot(tmp_path, mesh(rule(None))) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        located = [node(f"sidecar~{ip}~x.shop~shop.svc.cluster.local") for ip in SIDECARS]
        for each in located:
            each.locality.region, each.locality.zone = "Kubernetes", "zone-a"
        streams = [client.delta_ads(each) for each in located]
        held = [await follow(s, {REVIEWS, PAGE}) for s in streams]
        assert {g.priority for g in held[0][types.ENDPOINT][REVIEWS].endpoints} == {0, 1}
        stats = pilot.discovery.stats

        stats.reset()
        pilot.write(mesh(rule({"Kubernetes/zone-a": 80, "Kubernetes/zone-b": 20})))
        for stream, state in zip(streams, held, strict=True):
            assert await read_one(stream, state) == {REVIEWS}, "its cluster alone"
            assert state[types.CLUSTER][REVIEWS].common_lb_config.HasField(
                "locality_weighted_lb_config"
            )
            assert await read_one(stream, state) == {REVIEWS}, "its assignment alone"
            assert weights(state[types.ENDPOINT][REVIEWS]) == {"zone-a": 80, "zone-b": 20}
        await responses_written(stats, {types.CLUSTER: 2, types.ENDPOINT: 2})

        stats.reset()
        pilot.write(mesh(rule({"Kubernetes/zone-a": 70, "Kubernetes/zone-b": 30})))
        for stream, state in zip(streams, held, strict=True):
            assert await read_one(stream, state) == {REVIEWS}
            assert weights(state[types.ENDPOINT][REVIEWS]) == {"zone-a": 70, "zone-b": 30}
        await responses_written(stats, {types.ENDPOINT: 2})
        assert types.CLUSTER not in stats.responses, "the cluster did not change"

        caplog.set_level(logging.WARNING, "pilot.sources.file")
        stats.reset()
        pilot.write(mesh(rule({"Kubernetes/zone-a": 70, "Kubernetes/zone-b": 20})))
        exposition = await _rejected(pilot.http_port)
        assert 'pilot_config_rejected_total{kind="DestinationRule"} 1.0' in exposition
        warned = [r.getMessage() for r in caplog.records if "DestinationRule" in r.getMessage()]
        assert len(warned) == 1 and "shop/reviews" in warned[0] and "sum to 90" in warned[0]
        assert not stats.responses, "the last good weights keep serving"


async def _rejected(port: int) -> str:
    """/metrics once the refusal is counted (the reload is asynchronous)."""
    return str(
        await wait_until(
            lambda: http_get(port, "/metrics"),
            30.0,
            "the refusal counted",
            until=lambda text: 'pilot_config_rejected_total{kind="DestinationRule"}' in text,
        )
    )
