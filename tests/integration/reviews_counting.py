"""Bookinfo's reviews and a sidecar's stream followed as Envoy follows it, for the tests
that count what each route or cluster change sends.

reviews (9080) in namespace shop: pods v1, v2, v3 (each may move to another address or
carry another version's label) and a DestinationRule of those subsets (or of some, written
in another namespace, with a trafficPolicy). A stream is followed as Envoy does: every
cluster and listener, the route configurations it holds, and the assignment of each
outbound cluster once CDS names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from envoy.config.route.v3 import route_pb2

from pilot.xds import types
from tests.support.mesh import Ep, endpoint_slice, pod, service
from tests.support.xds_client import DeltaStream, delta_resources

HOST = "reviews.shop.svc.cluster.local"
PODS = {"10.44.1.1": "v1", "10.44.1.2": "v2", "10.44.1.3": "v3"}
SUBSETS = ("v1", "v2", "v3")
TIMEOUT = 30.0
ASKED = "assignments asked for"  # in a stream's `held`: as Envoy, each asked for once


def cluster(subset: str) -> str:
    return f"outbound|9080|{subset}|{HOST}"


def reviews(
    unready: str = "", pods: Mapping[str, str] = PODS, relabel: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """reviews' service, endpoints (the one at `unready` not ready) and Pods.

    `pods`: each Pod's address -> its version (its name `reviews-VERSION`); `relabel`: a
    version -> the `version` label its Pod carries instead of its own.
    """
    labels = {v: v for v in pods.values()} | dict(relabel or {})
    slice_ = [Ep(ip, ready=ip != unready, pod=f"reviews-{v}") for ip, v in pods.items()]
    return [
        service("reviews", "shop", [("http", 9080)]),
        endpoint_slice("reviews", slice_, "shop", [("http", 9080)]),
        *(pod(f"reviews-{v}", ip, "shop", labels={"version": labels[v]}) for ip, v in pods.items()),
    ]


def reviews_subsets(
    versions: Iterable[str] = SUBSETS,
    namespace: str = "shop",
    policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A DestinationRule for reviews defining its subsets `versions` (v1..v3 by default),
    written in `namespace` (outside shop, for reviews' FQDN), `policy` its trafficPolicy."""
    spec: dict[str, Any] = {
        "host": "reviews" if namespace == "shop" else HOST,
        "subsets": [{"name": v, "labels": {"version": v}} for v in versions],
    }
    if policy is not None:
        spec["trafficPolicy"] = policy
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "reviews", "namespace": namespace},
        "spec": spec,
    }


async def read_one(stream: DeltaStream, held: dict[str, dict[str, Any]]) -> tuple[str, set[str]]:
    """One response applied (new clusters' assignments asked for): its type and names."""
    response = await stream.next_response(TIMEOUT)
    got = delta_resources(response)
    for name, resource in got.items():
        held.setdefault(response.type_url, {})[name] = resource.message
    await stream.ack(response)
    asked = held.setdefault(ASKED, {})
    eds = sorted(n for n in got if n.startswith("outbound|") and n not in asked)
    if response.type_url == types.CLUSTER and eds:
        asked.update(dict.fromkeys(eds))
        await stream.subscribe(types.ENDPOINT, eds)
    return response.type_url, set(got) | set(response.removed_resources)


async def follow(
    stream: DeltaStream, routes: list[str], versions: Iterable[str] = SUBSETS
) -> dict[str, dict[str, Any]]:
    """Subscribe as Envoy does, until the stream holds its routes and the assignment of
    every cluster it holds (those of reviews' subsets `versions` among them)."""
    held: dict[str, dict[str, Any]] = {}
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.LISTENER, ["*"])
    await stream.subscribe(types.ROUTE, routes)
    subsets = {cluster(v) for v in versions}

    def done() -> bool:
        clusters = {n for n in held.get(types.CLUSTER, {}) if n.startswith("outbound|")}
        assignments = held.get(types.ENDPOINT, {}).keys()
        return set(routes) <= held.get(types.ROUTE, {}).keys() and subsets | clusters <= assignments

    while not done():
        await read_one(stream, held)
    return held


def reviews_routes(held: dict[str, dict[str, Any]]) -> list[route_pb2.Route]:
    """The routes of reviews' virtual host in route configuration 9080."""
    config: route_pb2.RouteConfiguration = held[types.ROUTE]["9080"]
    [vhost] = [h for h in config.virtual_hosts if h.name == f"{HOST}:9080"]
    return list(vhost.routes)
