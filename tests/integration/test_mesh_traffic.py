"""Pod to pod through two Envoys, as a mesh carries it: captured traffic, mTLS, STRICT, changes.

One set-up for the module (tests/integration/mesh_pods.py): pods as network
namespaces, the test API server and `pilot discovery` on it through a kubeconfig,
Services, EndpointSlices and Pods naming the pods' addresses; pods `a` (frontend)
and `b` (reviews) run a sidecar (`pilot agent iptables`, then `pilot agent` starting
Envoy as uid 1337), `c` (ratings) none. The app is the real curl in pod a, as uid
1000, dialling a service by name (hosts entries give each Service's ClusterIP, so
only the capture rules and Envoy can carry the connection):

1. a -> reviews reaches b's backend through both Envoys over mTLS: the backend sees
   a's SPIFFE id in x-forwarded-client-cert, b's Envoy counts a TLS handshake on
   its inbound listener (0.0.0.0:15006), a's Envoy one on the outbound cluster;
2. a -> ratings (no sidecar) is carried by a's Envoy in plaintext;
3. a PeerAuthentication STRICT in b's namespace refuses plaintext from c to b's pod,
   while a -> b still works; deleting it lets plaintext in again;
4. a new Service (EndpointSlice, Pods) is reachable from a, and an endpoint removed
   from its slice gets no more requests.

Nothing is restarted between the steps: Envoy converges by xDS, waited for by its
admin API. Where a step fails, its message says what pilot did not give
(no inbound listener, no socket match, a PeerAuthentication not served).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import pytest

from tests.integration.http_backend import Seen
from tests.integration.mesh_pods import (
    APP_NAMESPACE,
    CONVERGE_TIMEOUT,
    FRONTEND,
    PORT,
    REVIEWS,
    Mesh,
    PodEnvoy,
    cluster_of,
    details_objects,
    module_mesh,
    peer_authentication,
    pod_address,
    request_from,
    requests_from,
    slice_object,
)
from tests.kubeapi import ApiError
from tests.support.envoy_process import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

INBOUND_LISTENER = "virtualInbound"
SOCKET_MATCH = "envoy.transport_socket_match"


mesh = module_mesh("mesh-traffic")


def _url(service_name: str, path: str) -> str:
    return f"http://{service_name}.{APP_NAMESPACE}:{PORT}{path}"


def _path(step: str) -> str:
    """A path no other request uses, so a backend's record of it is this request's."""
    return f"/{step}-{secrets.token_hex(4)}"


async def _inbound_missing(sidecar: PodEnvoy) -> str:
    """What keeps captured inbound traffic from the app, said plainly ('' if nothing)."""
    listeners = await sidecar.listeners()
    if INBOUND_LISTENER not in listeners:
        return (
            f"pod {sidecar.pod.name}'s Envoy has no {INBOUND_LISTENER} listener on 15006"
            f" (pilot serves it only {sorted(listeners)}): the capture rules send inbound"
            " connections there, so they are refused"
        )
    return ""


async def _outbound_tls_missing(mesh: Mesh, cluster: str, pod: str) -> str:
    """What keeps a's Envoy from dialling `pod`'s endpoint of `cluster` over mTLS."""
    config = (await mesh.frontend.clusters()).get(cluster, {})
    if "transport_socket_matches" not in config:
        return f"{cluster} has no transport_socket_matches (auto mTLS): a's Envoy dials plaintext"
    metadata = (await mesh.frontend.endpoint_metadata(cluster)).get(pod_address(pod), {})
    if metadata.get(SOCKET_MATCH) != {"tlsMode": "istio"}:
        return (
            f"pod {pod}'s endpoint of {cluster} has filter metadata {metadata}, not"
            f" {SOCKET_MATCH}: {{tlsMode: istio}} (its Pod has the label)"
        )
    return ""


async def _why(mesh: Mesh, cluster: str) -> str:
    reasons = [
        await _inbound_missing(mesh.reviews),
        await _outbound_tls_missing(mesh, cluster, "b"),
    ]
    return "; ".join(reason for reason in reasons if reason) or "nothing known missing"


async def _frontend_to_reviews(mesh: Mesh, step: str, headers: Sequence[str] = ()) -> Seen:
    """a's app GETs reviews by name; b's backend must see it, with a's SPIFFE id."""
    path = _path(step)
    status = await request_from(mesh.pod("a"), _url("reviews", path), headers=headers)
    assert status == 200, (
        f"GET {_url('reviews', path)} from pod a (uid 1000, captured) answered {status}:"
        f" {await _why(mesh, cluster_of('reviews'))}"
    )
    seen = await mesh.backends["b"].wait_seen(path)
    uri = seen.xfcc_field("URI")
    assert uri == FRONTEND.spiffe_id, (
        f"reviews' backend saw x-forwarded-client-cert {seen.xfcc!r}: URI {uri!r}, not"
        f" a's identity {FRONTEND.spiffe_id}"
    )
    by = seen.xfcc_field("By")
    assert by == REVIEWS.spiffe_id, f"XFCC {seen.xfcc!r}: By {by!r}, not b's {REVIEWS.spiffe_id}"
    return seen


# The first test runs the set-up: a plain one, so that a set-up failure shows as one.
async def test_a_pod_without_a_sidecar_is_reached_in_plaintext(mesh: Mesh) -> None:
    ratings = cluster_of("ratings")
    path = _path("plaintext")
    status = await request_from(mesh.pod("a"), _url("ratings", path))
    assert status == 200, f"GET {_url('ratings', path)} from pod a answered {status}"
    seen = await mesh.backends["c"].wait_seen(path)
    assert seen.xfcc == "", f"ratings has no sidecar, yet its backend saw XFCC {seen.xfcc!r}"
    # Only a's Envoy routes the ClusterIP: the request went through its outbound cluster.
    carried = await mesh.frontend.cluster_stat(ratings, "upstream_rq_completed")
    assert carried >= 1, f"a's Envoy counts no request on {ratings}"
    handshakes = await mesh.frontend.cluster_stat(ratings, "ssl.handshake")
    assert handshakes == 0, f"a's Envoy made {handshakes} TLS handshakes to a pod without sidecar"


async def test_frontend_reaches_reviews_through_both_envoys_with_its_identity(mesh: Mesh) -> None:
    reviews = cluster_of("reviews")
    await _frontend_to_reviews(mesh, "mtls")
    handshakes = await mesh.reviews.listener_stat(INBOUND_LISTENER, "ssl.handshake")
    assert handshakes > 0, f"b's Envoy counts no TLS handshake on {INBOUND_LISTENER}"
    upstream = await mesh.frontend.cluster_stat(reviews, "ssl.handshake")
    assert upstream > 0, f"a's Envoy counts no TLS handshake to {reviews}"


FORGED = (
    "x-forwarded-client-cert: By=spiffe://cluster.local/ns/bookinfo/sa/reviews;"
    "URI=spiffe://cluster.local/ns/istio-system/sa/admin"
)


async def test_an_app_cannot_forge_the_client_certificate_header(mesh: Mesh) -> None:
    """The identity b's app sees is what the peer proved, never what its request said."""
    seen = await _frontend_to_reviews(mesh, "forged", headers=[FORGED])
    assert "admin" not in seen.xfcc, f"a's forged XFCC reached reviews: {seen.xfcc!r}"
    path = _path("forged-plaintext")
    url = f"http://{pod_address('b')}:{PORT}{path}"
    status = await request_from(mesh.pod("c"), url, headers=[FORGED])
    assert status == 200, f"PERMISSIVE: plaintext from c to b's pod answered {status}"
    plaintext = await mesh.backends["b"].wait_seen(path)
    assert plaintext.xfcc == "", f"c proved nothing, yet reviews saw XFCC {plaintext.xfcc!r}"


# ------------------------------------------------------------------ STRICT


def _plaintext_chains(inbound: dict[str, Any], port: int) -> list[dict[str, Any]]:
    """virtualInbound's chains for `port` that take a connection without TLS."""
    return [
        chain
        for chain in inbound.get("filter_chains", [])
        if chain.get("filter_chain_match", {}).get("destination_port") == port
        and chain["filter_chain_match"].get("transport_protocol") != "tls"
    ]


async def _wait_plaintext_accepted(sidecar: PodEnvoy, accepted: bool, what: str) -> None:
    async def chains() -> int:
        listeners = await sidecar.listeners()
        return len(_plaintext_chains(listeners.get(INBOUND_LISTENER, {}), PORT))

    await wait_until(
        chains, CONVERGE_TIMEOUT, f"b's {INBOUND_LISTENER} {what}",
        until=lambda count: (count > 0) == accepted, context=sidecar.agent.tail,
    )  # fmt: skip


async def _plaintext_from_c(mesh: Mesh) -> tuple[int, str]:
    """c (no sidecar) GETs b's pod address directly: the status, and the path asked."""
    path = _path("from-c")
    url = f"http://{pod_address('b')}:{PORT}{path}"
    return await request_from(mesh.pod("c"), url), path


def _apply(mesh: Mesh, obj: dict[str, Any]) -> None:
    try:
        mesh.api.apply(obj)
    except (ApiError, ValueError, KeyError) as error:
        pytest.fail(f"the test API server does not take {obj['apiVersion']} {obj['kind']}: {error}")


async def test_strict_refuses_plaintext_until_the_peer_authentication_goes(mesh: Mesh) -> None:
    status, _ = await _plaintext_from_c(mesh)
    assert status == 200, (
        f"PERMISSIVE: plaintext from c to b's pod answered {status}:"
        f" {await _inbound_missing(mesh.reviews) or 'b has a virtualInbound'}"
    )
    _apply(mesh, peer_authentication("STRICT"))
    try:
        await _wait_plaintext_accepted(mesh.reviews, False, "to drop its plaintext chains")
        status, path = await _plaintext_from_c(mesh)
        assert status == 0, f"STRICT: plaintext from c to b's pod answered {status}"
        assert path not in mesh.backends["b"].paths(), "STRICT: b's backend got plaintext"
        await _frontend_to_reviews(mesh, "strict")
    finally:
        mesh.api.delete("PeerAuthentication", APP_NAMESPACE, "default")
    await _wait_plaintext_accepted(mesh.reviews, True, "to take plaintext again")
    status, _ = await _plaintext_from_c(mesh)
    assert status == 200, f"PERMISSIVE again: plaintext from c to b's pod answered {status}"


# ------------------------------------------------------------------ changes


async def _wait_details(mesh: Mesh, pods: list[str], what: str) -> None:
    expected = {(pod_address(pod), PORT) for pod in pods}
    await mesh.frontend.wait_hosts(cluster_of("details"), expected, what)


async def _until_each_backend_answers(mesh: Mesh, pods: list[str]) -> None:
    """Requests to details until each of `pods` has answered one (load balancing)."""

    async def answered() -> bool:
        path = _path("details")
        assert await request_from(mesh.pod("a"), _url("details", path)) == 200
        return all(
            any(p.startswith("/details-") for p in mesh.backends[pod].paths()) for pod in pods
        )

    await wait_until(answered, CONVERGE_TIMEOUT, f"each of {pods} to answer a request")


async def test_a_new_service_is_reachable_without_a_restart(mesh: Mesh) -> None:
    for obj in details_objects(["d", "e"]):
        mesh.api.apply(obj)
    await _wait_details(mesh, ["d", "e"], "the new service's endpoints")
    await mesh.frontend.wait_route("details")
    await _until_each_backend_answers(mesh, ["d", "e"])
    mesh.assert_nothing_restarted()


# What a push of each type counts at Envoy (SotW ADS): CDS, LDS, and RDS of every route.
PUSH_COUNTERS = r"^(cluster_manager\.cds|listener_manager\.lds|http\..*\.rds\..*)\.update_attempt$"


async def test_an_endpoint_removed_from_its_slice_gets_no_more_requests(mesh: Mesh) -> None:
    for obj in details_objects(["d", "e"]):
        mesh.api.apply(obj)
    await _wait_details(mesh, ["d", "e"], "both endpoints")
    await mesh.frontend.wait_route("details")  # RDS comes last: nothing of the service is in flight
    before = await mesh.frontend.stats(PUSH_COUNTERS)
    mesh.api.apply(slice_object("details", ["d"]))
    await _wait_details(mesh, ["d"], "e removed from the slice")
    paths = [_path("after-removal") for _ in range(12)]
    statuses = await requests_from(mesh.pod("a"), [_url("details", path) for path in paths])
    assert statuses == [200] * len(paths), f"details answered {statuses}"
    for path in paths:
        await mesh.backends["d"].wait_seen(path)
    got = set(paths) & mesh.backends["e"].paths()
    assert got == set(), f"e, removed from the slice, still got {len(got)} requests"
    after = await mesh.frontend.stats(PUSH_COUNTERS)
    assert after == before, f"an endpoint change pushed more than EDS: {before} -> {after}"
    mesh.assert_nothing_restarted()
