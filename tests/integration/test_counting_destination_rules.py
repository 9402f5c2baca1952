"""DestinationRules from the registry file, counted: what each change sends, to whom.

Bookinfo's reviews (pods v1, v2, v3) with a DestinationRule of subsets v1 and v2 in
the registry file, and two sidecars on delta ADS (clusters `*`, and the
assignments of the clusters they hold, as Envoy subscribes). A subset added to
the rule sends each sidecar one CDS response holding only the new subset's
cluster, then only its assignment; an endpoint change sends assignments alone
(the subset's it is in, and the service's), never a cluster. A version of the file
whose rule is invalid keeps the rule's last good version serving (nothing
removed), is one warning naming it and a metric, and the other objects of the
file (a new rule for productpage) still apply. Gateway and Sidecar objects in the
file are counted and listed on /debug/configz.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pilot.xds import types
from tests.support.mesh import Ep, endpoint_slice, pod, service
from tests.support.pilot import responses_written, running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, endpoint_ips, node

HOST = "reviews.shop.svc.cluster.local"
PAGE = "productpage.shop.svc.cluster.local"
PODS = {"10.44.1.1": "v1", "10.44.1.2": "v2", "10.44.1.3": "v3"}
SIDECARS = ("10.44.0.7", "10.44.0.8")
TIMEOUT = 30.0


def cluster(subset: str, host: str = HOST, port: int = 9080) -> str:
    return f"outbound|{port}|{subset}|{host}"


def rule(name: str, host: str, subsets: Iterable[str]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "host": host,
            "subsets": [{"name": s, "labels": {"version": s}} for s in subsets],
        },
    }


def istio_object(kind: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {},
    }


def mesh(
    *rules: dict[str, Any], unready: str = "", relabel: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    slice_ = [Ep(ip, ready=ip != unready, pod=f"reviews-{v}") for ip, v in PODS.items()]
    labels = {**PODS, **(relabel or {})}
    return [
        service("reviews", "shop", [("http", 9080)]),
        endpoint_slice("reviews", slice_, "shop", [("http", 9080)]),
        *(
            pod(f"reviews-{v}", ip, "shop", labels={"version": labels[ip]})
            for ip, v in PODS.items()
        ),
        service("productpage", "shop", [("http", 9080)]),
        endpoint_slice(
            "productpage", [Ep("10.44.2.1", pod="productpage-v1")], "shop", [("http", 9080)]
        ),
        pod("productpage-v1", "10.44.2.1", "shop", labels={"version": "v1"}),
        istio_object("Gateway", "bookinfo-gateway"),
        istio_object("Sidecar", "default"),
        *rules,
    ]


async def follow(stream: DeltaStream, until: set[str]) -> dict[str, dict[str, Any]]:
    """Read as Envoy does (clusters, then the assignments of each cluster held) until the
    stream holds every one of `until`, as clusters and assignments."""
    held: dict[str, dict[str, Any]] = {types.CLUSTER: {}, types.ENDPOINT: {}}
    await stream.subscribe(types.CLUSTER, ["*"])
    while not (until <= held[types.CLUSTER].keys() and until <= held[types.ENDPOINT].keys()):
        await read_one(stream, held)
    return held


async def read_one(stream: DeltaStream, held: dict[str, dict[str, Any]]) -> set[str]:
    """One response applied (and, for new clusters, their assignments asked for)."""
    response = await stream.next_response(TIMEOUT)
    got = delta_resources(response)
    for name, resource in got.items():
        held[response.type_url][name] = resource.message
    for name in response.removed_resources:
        held[response.type_url].pop(name, None)
    await stream.ack(response)
    if response.type_url == types.CLUSTER and got:
        await stream.subscribe(types.ENDPOINT, sorted(got))
    return set(got) | set(response.removed_resources)


async def http_get(port: int, path: str) -> str:
    """pilot runs in this test's loop: asked without blocking it."""
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as answer,
    ):
        return await answer.text()


async def counted_and_listed(port: int) -> None:
    """The refused rule counted, the Gateway and Sidecar counted and listed, and which
    services each rule applies to (the refused one's last good version still does)."""
    exposition = await http_get(port, "/metrics")
    assert 'pilot_config_rejected_total{kind="DestinationRule"} 1.0' in exposition
    assert 'pilot_config_unsupported{kind="Gateway"} 1.0' in exposition
    listed = json.loads(await http_get(port, "/debug/configz"))
    assert {(o["kind"], o["name"]) for o in listed["unsupported"]} == {
        ("Gateway", "bookinfo-gateway"),
        ("Sidecar", "default"),
    }
    applied = {o["name"]: o["appliedTo"] for o in listed["objects"]}
    assert applied == {"reviews": ["shop/reviews"], "page": ["shop/productpage"]}


async def test_subsets_changes_and_refused_versions_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = mesh(rule("reviews", "reviews", ["v1", "v2"]))
    async with running_pilot(tmp_path, first) as pilot, XdsClient(pilot.grpc_target) as client:
        streams = [
            client.delta_ads(node(f"sidecar~{ip}~x.shop~shop.svc.cluster.local")) for ip in SIDECARS
        ]
        held = [await follow(s, {cluster("v1"), cluster("v2")}) for s in streams]
        assert endpoint_ips(held[0][types.ENDPOINT][cluster("v2")]) == {"10.44.1.2"}
        assert cluster("v3") not in held[0][types.CLUSTER]
        stats = pilot.discovery.stats

        # A new subset: one CDS response with its cluster alone, then its assignment alone.
        stats.reset()
        pilot.write(mesh(rule("reviews", "reviews", ["v1", "v2", "v3"])))
        for stream, state in zip(streams, held, strict=True):
            assert await read_one(stream, state) == {cluster("v3")}
            assert await read_one(stream, state) == {cluster("v3")}
            assert endpoint_ips(state[types.ENDPOINT][cluster("v3")]) == {"10.44.1.3"}
        await responses_written(stats, {types.CLUSTER: 2, types.ENDPOINT: 2})

        # An endpoint of v1 not ready: the assignments it is in, and no cluster.
        stats.reset()
        pilot.write(mesh(rule("reviews", "reviews", ["v1", "v2", "v3"]), unready="10.44.1.1"))
        for stream, state in zip(streams, held, strict=True):
            assert await read_one(stream, state) == {cluster("v1"), cluster("")}
            assert endpoint_ips(state[types.ENDPOINT][cluster("v1")]) == set()
        await responses_written(stats, {types.ENDPOINT: 2})

        # The v3 pod relabelled v2: the two subsets' assignments, and no cluster.
        stats.reset()
        three = rule("reviews", "reviews", ["v1", "v2", "v3"])
        pilot.write(mesh(three, unready="10.44.1.1", relabel={"10.44.1.3": "v2"}))
        for stream, state in zip(streams, held, strict=True):
            names: set[str] = set()
            while not {cluster("v2"), cluster("v3")} <= names:
                names |= await read_one(stream, state)
            assert names == {cluster("v2"), cluster("v3")}
            assert endpoint_ips(state[types.ENDPOINT][cluster("v2")]) == {"10.44.1.2", "10.44.1.3"}
            assert endpoint_ips(state[types.ENDPOINT][cluster("v3")]) == set()
        assert types.CLUSTER not in stats.responses

        # The rule broken, a rule for productpage added: the broken one's last good version
        # stays (nothing removed), the new one applies, one warning names the broken one.
        caplog.set_level(logging.WARNING, "pilot.sources.file")
        broken = rule("reviews", "reviews", ["v1", "v2", "v3"])
        broken["spec"]["subsets"][0]["name"] = "V1|evil"
        stats.reset()
        pilot.write(mesh(broken, rule("page", "productpage", ["v1"]), relabel={"10.44.1.3": "v2"}))
        for stream, state in zip(streams, held, strict=True):
            names = set()
            back = {cluster("v1"), cluster("")}  # v1's endpoint is ready again
            page = cluster("v1", PAGE)
            while not ({cluster("v1", PAGE), *back} <= names and page in state[types.ENDPOINT]):
                names |= await read_one(stream, state)
            assert names == {cluster("v1", PAGE), *back}
            assert endpoint_ips(state[types.ENDPOINT][cluster("v1", PAGE)]) == {"10.44.2.1"}
            assert {cluster(v) for v in ("v1", "v2", "v3")} <= state[types.CLUSTER].keys()
        warnings = [r.getMessage() for r in caplog.records if "DestinationRule" in r.getMessage()]
        assert len(warnings) == 1 and "shop/reviews" in warnings[0]
        assert "spec.subsets[0].name" in warnings[0]
        await counted_and_listed(pilot.http_port)
