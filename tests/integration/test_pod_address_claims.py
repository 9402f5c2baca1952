"""Pods claiming a service endpoint's address, against real pods, pilot and Envoys.

The mesh of tests/integration/mesh_pods.py: `reviews`' EndpointSlice lists pod b's
address with a targetRef to b's Pod (as Kubernetes writes it), b runs a sidecar as
`bookinfo/reviews`. Another Pod object then names b's address as its podIP:

1. a Pod of namespace `aaa` (sorting before `bookinfo`), and one of `bookinfo` whose
   name sorts before b's, each with a sidecar label and the account `intruder`: a's
   Envoy keeps accepting only b's identity for reviews, and a -> reviews keeps
   reaching b over mTLS (were an endpoint's pod the first claimant of its address,
   the cluster would accept only the intruder's identity, and b's would be refused);
2. the takeover: b's eth0 down and a second pod `x` on the bridge at b's address,
   running a sidecar as `aaa/intruder` and a backend: a's request to reviews reaches
   x's Envoy, which proves the wrong identity, and is refused there; x's backend
   never sees it. b is put back afterwards and answers again.

Pilot has seen the intruder's Pod once a later Pod event has reached a's Envoy (one
watch delivers Pods in order): pod d's sidecar label, flipped, changes the mTLS mark
of its `details` endpoint.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import pytest
import pytest_asyncio

from tests.integration.mesh_pods import (
    APP_NAMESPACE,
    CONVERGE_TIMEOUT,
    DETAILS,
    FRONTEND,
    PILOT_HOST,
    PORT,
    REVIEWS,
    Backend,
    Mesh,
    PodEnvoy,
    _backend,
    _checked,
    _ready,
    _sidecar,
    cluster_of,
    details_objects,
    mesh_pods,
    namespace_object,
    pod_address,
    pod_object,
    request_from,
)
from tests.integration.sidecar_support import Workload
from tests.support.envoy_process import wait_until
from tests.support.pods import add_pod_at

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

INTRUDER_NAMESPACE = "aaa"  # sorts before bookinfo: by namespace and name, it comes first
ELSEWHERE = Workload(INTRUDER_NAMESPACE, "intruder", "aaa-intruder")
BESIDE = Workload(APP_NAMESPACE, "intruder", "aaa-intruder")  # sorts before b's pod name
SOCKET_MATCH = "envoy.transport_socket_match"
REVIEWS_CLUSTER = cluster_of("reviews")
DETAILS_CLUSTER = cluster_of("details")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    async with mesh_pods(tmp_path_factory.mktemp("address-claims")) as running:
        running.api.apply(namespace_object(INTRUDER_NAMESPACE))
        for obj in details_objects(["d"]):  # d's Pod: the marker of Pods seen
            running.api.apply(obj)
        await running.frontend.wait_hosts(DETAILS_CLUSTER, {(pod_address("d"), PORT)}, "d")
        yield running
        running.assert_nothing_restarted()


def _url(path: str) -> str:
    return f"http://reviews.{APP_NAMESPACE}:{PORT}{path}"


def _path(step: str) -> str:
    return f"/{step}-{secrets.token_hex(4)}"


def _claiming_bs_address(workload: Workload) -> dict[str, Any]:
    """A running Pod with a sidecar label whose podIP is b's."""
    return pod_object("b", workload, "intruder", sidecar=True)


async def _pods_seen(mesh: Mesh) -> None:
    """Until pilot has applied every Pod event sent so far, and a's Envoy holds what
    followed from them: d's label flipped after them shows as its endpoint's mark,
    and no cluster of a's is still warming (a cluster pushed before that mark)."""
    d = pod_address("d")
    marked = SOCKET_MATCH in (await mesh.frontend.endpoint_metadata(DETAILS_CLUSTER)).get(d, {})
    mesh.api.apply(pod_object("d", DETAILS[0], "details", sidecar=not marked))
    await wait_until(
        lambda: mesh.frontend.endpoint_metadata(DETAILS_CLUSTER), CONVERGE_TIMEOUT,
        "pod d's label flipped after the intruder's Pod to reach a's Envoy",
        until=lambda metadata: (SOCKET_MATCH in metadata.get(d, {})) != marked,
        context=mesh.frontend.agent.tail,
    )  # fmt: skip
    await wait_until(
        lambda: mesh.frontend.admin_json("/config_dump", resource="dynamic_warming_clusters"),
        CONVERGE_TIMEOUT, "a's Envoy to warm no cluster",
        until=lambda dump: not dump.get("configs"), context=mesh.frontend.agent.tail,
    )  # fmt: skip


async def _sans(sidecar: PodEnvoy, cluster: str) -> list[str]:
    """The SPIFFE ids the Envoy's `cluster` accepts of an mTLS endpoint."""
    config = (await sidecar.clusters()).get(cluster, {})
    sans = []
    for match in config.get("transport_socket_matches", []):
        tls = match.get("transport_socket", {}).get("typed_config", {})
        context = tls.get("common_tls_context", {}).get("combined_validation_context", {})
        validation = context.get("default_validation_context", {})
        sans += [m["matcher"]["exact"] for m in validation.get("match_typed_subject_alt_names", [])]
    return sans


async def _reviews_is_b(mesh: Mesh, step: str) -> None:
    """a's request to reviews reaches b over mTLS, and a's Envoy accepts only b's identity
    for reviews."""
    sans = await _sans(mesh.frontend, REVIEWS_CLUSTER)
    path = _path(step)
    status = await request_from(mesh.pod("a"), _url(path))
    assert status == 200, (
        f"GET {_url(path)} from pod a answered {status}: a's Envoy accepts {sans} for"
        f" {REVIEWS_CLUSTER}, not b's {REVIEWS.spiffe_id} (its slice's targetRef's Pod)"
    )
    seen = await mesh.backends["b"].wait_seen(path)
    assert (seen.xfcc_field("By"), seen.xfcc_field("URI")) == (
        REVIEWS.spiffe_id,
        FRONTEND.spiffe_id,
    ), f"b's backend saw XFCC {seen.xfcc!r}"
    assert sans == [REVIEWS.spiffe_id], f"a's Envoy accepts {sans} for {REVIEWS_CLUSTER}"
    metadata = (await mesh.frontend.endpoint_metadata(REVIEWS_CLUSTER)).get(pod_address("b"), {})
    assert metadata.get(SOCKET_MATCH) == {"tlsMode": "istio"}, f"b's endpoint: {metadata}"


@pytest.mark.parametrize("intruder", [ELSEWHERE, BESIDE], ids=["another-namespace", "same"])
async def test_a_pod_claiming_bs_address_takes_nothing_of_reviews(
    mesh: Mesh, intruder: Workload
) -> None:
    await _reviews_is_b(mesh, "before")
    mesh.api.apply(_claiming_bs_address(intruder))
    try:
        await _pods_seen(mesh)
        await _reviews_is_b(mesh, f"claimed-{intruder.namespace}")
    finally:
        mesh.api.delete("Pod", intruder.namespace, intruder.pod_name)
        await _pods_seen(mesh)  # gone for the next test, whatever happened here


async def _flush_neighbours(mesh: Mesh) -> None:
    """Forget which link answered for each address (b's, then x's, at one address)."""
    for name in ("a", "istiod"):
        await _checked(mesh.pod(name), ["ip", "neigh", "flush", "all"], "ip neigh flush")


async def _link(mesh: Mesh, pod: str, state: str) -> None:
    await _checked(mesh.pod(pod), ["ip", "link", "set", "eth0", state], f"eth0 {state}")


async def _never_answered_by(mesh: Mesh, intruder: Backend) -> None:
    """a's requests to reviews until a's Envoy has dialled the intruder and refused the
    identity it proved (the first may go on a pooled connection to b, reset), or until
    one is answered; none may be, and the intruder's backend sees none."""
    refused = await mesh.frontend.cluster_stat(REVIEWS_CLUSTER, "ssl.fail_verify_san")
    answered: list[int] = []

    async def refused_or_answered() -> bool:
        status = await request_from(mesh.pod("a"), _url(_path("takeover")))
        answered.append(status)
        now = await mesh.frontend.cluster_stat(REVIEWS_CLUSTER, "ssl.fail_verify_san")
        return status == 200 or now > refused

    await wait_until(
        refused_or_answered, CONVERGE_TIMEOUT, "a's Envoy to dial x and refuse its identity",
        context=mesh.frontend.agent.tail,
    )  # fmt: skip
    taken = sorted(path for path in intruder.paths() if path.startswith("/takeover-"))
    assert 200 not in answered and taken == [], (
        f"the intruder at b's address answered a's requests to reviews ({answered}; its"
        f" backend saw {taken}): a's Envoy accepts {await _sans(mesh.frontend, REVIEWS_CLUSTER)}"
    )


async def test_an_intruder_at_bs_address_with_its_own_sidecar_is_refused(mesh: Mesh) -> None:
    token = mesh.api.add_service_account_token(ELSEWHERE.namespace, ELSEWHERE.service_account)
    mesh.api.apply(_claiming_bs_address(ELSEWHERE))
    await _link(mesh, "b", "down")
    try:
        async with AsyncExitStack() as stack:
            hosts = {PILOT_HOST: pod_address("istiod")}
            x = add_pod_at(mesh.network, "x", "b", hosts)
            await _flush_neighbours(mesh)
            backend = await _backend(stack, x)
            intruder = await _sidecar(stack, x, ELSEWHERE, mesh.pilot, token)
            await _ready(intruder)
            await _pods_seen(mesh)
            await _never_answered_by(mesh, backend)
            await _checked(x, ["ip", "link", "set", "eth0", "down"], "x's eth0 down")
    finally:
        mesh.api.delete("Pod", ELSEWHERE.namespace, ELSEWHERE.pod_name)
        await _link(mesh, "b", "up")
        await _flush_neighbours(mesh)
    await _pods_seen(mesh)
    await _reviews_is_b(mesh, "b-back")
