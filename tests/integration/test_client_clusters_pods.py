"""DestinationRules that depend on the client, followed by real Envoys with real backends.

The pods of tests/integration/client_pods.py: web and tester (namespace default) and
front (namespace front) call reviews (default), whose pods v1, v2 and v3 answer with
their version. Each test writes the registry file with a DestinationRule private to
front (`exportTo: ["."]`, written in front for default's reviews), waits until each
Envoy's /clusters holds what its namespace's rule makes of reviews (each cluster, the
pods behind it, its circuit breaker's connection limit), and sends real requests:
front's private subsets carry front's requests to the version its own VirtualService
names (and follow a pod relabelled), while web keeps reviews' shared cluster alone;
front's connection limit is in front's clusters and overflows under front's requests,
not web's; removing front's rule gives front the public rule's clusters again, and its
requests go where that rule says. After each, no Envoy has rejected anything.
"""

from __future__ import annotations

import pytest

from tests.integration.client_pods import (
    CONVERGE_TIMEOUT,
    PORT,
    REVIEWS_HOST,
    SUBSETS,
    VERSIONS,
    ClientMesh,
    Obj,
    destination_rule,
    module_client_pods,
    nothing_rejected,
    only,
    pod_address,
    spread,
    subsets,
    to,
    virtual_service,
)
from tests.support.envoy_process import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

mesh = module_client_pods("client-clusters")

UNLIMITED = 2**32 - 1  # Istio's default maximum, where a rule sets none
ALL = frozenset(VERSIONS)
VERSION_AT = {pod_address(f"r{v}"): v for v in VERSIONS}
# What an Envoy holds for reviews: subset ("" for the service's own cluster) -> the
# versions of the pods behind it and the cluster's maximum connections.
Held = dict[str, tuple[frozenset[str], int]]


def held_as(pods: dict[str, set[str]], max_connections: int = UNLIMITED) -> Held:
    """reviews' own cluster over every pod, and a cluster per subset over `pods[subset]`."""
    clusters = {"": ALL, **{name: frozenset(versions) for name, versions in pods.items()}}
    return {name: (versions, max_connections) for name, versions in clusters.items()}


NO_SUBSETS = held_as({})
PUBLIC = held_as({v: {v} for v in VERSIONS})  # what SUBSETS gives every sidecar


def private_to_front(name: str, spec: Obj) -> Obj:
    """Written in front for default's reviews (by FQDN), for front's sidecars alone."""
    return destination_rule(name, "front", {"host": REVIEWS_HOST, "exportTo": ["."], **spec})


# front's own routes: every request to subset v2, whichever rule front follows.
FRONT_TO_V2 = virtual_service(
    "reviews-front",
    "front",
    {"hosts": [REVIEWS_HOST], "exportTo": ["."], "http": [{"route": [to("v2", REVIEWS_HOST)]}]},
)


async def held(mesh: ClientMesh, client: str) -> Held:
    """What `client`'s Envoy holds for reviews, from its /clusters."""
    clusters = await mesh.sidecars[client].admin_json("/clusters", format="json")
    found: Held = {}
    for status in clusters.get("cluster_statuses", []):
        parts = status["name"].split("|")  # outbound|PORT|SUBSET|FQDN
        if len(parts) != 4 or parts[3] != REVIEWS_HOST:
            continue
        addresses = [
            h["address"]["socket_address"]["address"] for h in status.get("host_statuses", [])
        ]
        limit = status["circuit_breakers"]["thresholds"][0]["max_connections"]
        found[parts[2]] = (frozenset(VERSION_AT[a] for a in addresses), int(limit))
    return found


async def wait_held(mesh: ClientMesh, client: str, expected: Held) -> None:
    """Until `client`'s Envoy holds exactly `expected` for reviews."""
    await wait_until(
        lambda: held(mesh, client), CONVERGE_TIMEOUT, f"{client}'s reviews clusters {expected}",
        until=expected.__eq__, context=mesh.sidecars[client].agent.tail,
    )  # fmt: skip


async def overflows(mesh: ClientMesh, client: str) -> int:
    """How often `client`'s Envoy found reviews' cluster at its connection limit."""
    cluster = f"outbound|{PORT}||{REVIEWS_HOST}"
    return await mesh.sidecars[client].cluster_stat(cluster, "upstream_cx_overflow")


async def test_a_rule_private_to_front_gives_fronts_envoy_its_subsets(mesh: ClientMesh) -> None:
    rule = private_to_front("reviews-front", {"subsets": subsets(*VERSIONS)})
    mesh.apply(rule, FRONT_TO_V2)
    await wait_held(mesh, "front", held_as({v: {v} for v in VERSIONS}))
    await wait_held(mesh, "web", NO_SUBSETS)  # no rule default sees defines a subset
    await only(mesh, "front", "v2")
    await spread(mesh, "web")

    # The v3 pod relabelled v2: front's v2 cluster takes it, and so do front's requests.
    mesh.apply(rule, FRONT_TO_V2, labels={"rv3": {"version": "v2"}})
    await wait_held(mesh, "front", held_as({"v1": {"v1"}, "v2": {"v2", "v3"}, "v3": set()}))
    answers = await mesh.versions("front", 24)
    assert set(answers) == {"reviews-v2", "reviews-v3"} and sum(answers.values()) == 24, answers
    await wait_held(mesh, "web", NO_SUBSETS)
    await nothing_rejected(mesh)


async def test_fronts_private_connection_limit_is_fronts_alone(mesh: ClientMesh) -> None:
    limited = {
        "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 1}}},
        "subsets": subsets("v1"),
    }
    mesh.apply(SUBSETS, private_to_front("reviews-front", limited))
    # front follows its own rule alone: the public rule's v2 and v3 are not front's.
    await wait_held(mesh, "front", held_as({"v1": {"v1"}}, max_connections=1))
    for client in ("web", "tester"):
        await wait_held(mesh, client, PUBLIC)

    before = {client: await overflows(mesh, client) for client in ("front", "web")}
    await spread(mesh, "front")  # over more than one pod: more than one connection asked
    await spread(mesh, "web")
    assert await overflows(mesh, "front") > before["front"]
    assert await overflows(mesh, "web") == before["web"]
    await nothing_rejected(mesh)


async def test_removing_fronts_rule_gives_front_the_public_one_again(mesh: ClientMesh) -> None:
    # front's own rule names v3's pod subset v2 (and has a subset of its own).
    canary = {
        "subsets": [
            {"name": "v2", "labels": {"version": "v3"}},
            {"name": "front-only", "labels": {"version": "v1"}},
        ]
    }
    mesh.apply(SUBSETS, private_to_front("reviews-canary", canary), FRONT_TO_V2)
    await wait_held(mesh, "front", held_as({"v2": {"v3"}, "front-only": {"v1"}}))
    await wait_held(mesh, "web", PUBLIC)
    await only(mesh, "front", "v3")

    mesh.apply(SUBSETS, FRONT_TO_V2)
    await wait_held(mesh, "front", PUBLIC)
    await only(mesh, "front", "v2")
    await spread(mesh, "web")
    await nothing_rejected(mesh)
