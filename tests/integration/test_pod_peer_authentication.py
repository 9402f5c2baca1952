"""PeerAuthentication per workload and per port, on real pods through real Envoys.

One set-up for the module (tests/integration/mesh_pods.py): pod `b` runs the
reviews backend on 9080 (the service's target port) behind its sidecar, and
here a second backend on 9081, a port no service names; pod `c` has no
sidecar and sends plaintext straight to b's address; pod `a`'s app reaches
reviews by name over mTLS through both Envoys. bookinfo has no namespace-wide
policy (PERMISSIVE) unless a test applies one.

1. a workload policy (selector `app: reviews`) STRICT: plaintext from c to b is
   refused, a -> reviews still answers with a's identity;
2. a namespace STRICT policy with `portLevelMtls {9080: PERMISSIVE}`: plaintext
   reaches 9080 only;
3. the reverse, PERMISSIVE with 9081 made STRICT by b's workload policy:
   plaintext reaches 9080 only.

Each test deletes its policies and waits for plaintext to be taken again.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from tests.integration.agent_process import REPO
from tests.integration.mesh_pods import (
    APP_NAMESPACE,
    APP_UID,
    CONVERGE_TIMEOUT,
    FRONTEND,
    PORT,
    Backend,
    Mesh,
    mesh_pods,
    pod_address,
    request_from,
)
from tests.support.envoy_process import wait_until
from tests.support.pod_process import running_in

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

OTHER_PORT = 9081  # b's second backend: no service names it
INBOUND_LISTENER = "virtualInbound"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    async with mesh_pods(tmp_path_factory.mktemp("pod-peer-authentication")) as running:
        argv = [sys.executable, "-m", "tests.integration.http_backend", "--host", "0.0.0.0"]
        argv += ["--port", str(OTHER_PORT)]
        async with running_in(
            running.pod("b"), argv, "serving on", uid=APP_UID, cwd=REPO
        ) as process:
            running.backends["b:other"] = Backend(running.pod("b"), process)
            yield running
        running.assert_nothing_restarted()


def policy(
    name: str, mode: str, selector: bool = False, ports: dict[int, str] | None = None
) -> Any:
    spec: dict[str, Any] = {"mtls": {"mode": mode}}
    if selector:
        spec["selector"] = {"matchLabels": {"app": "reviews"}}
    if ports:
        spec["portLevelMtls"] = {str(port): {"mode": m} for port, m in ports.items()}
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": name, "namespace": APP_NAMESPACE},
        "spec": spec,
    }


async def plaintext_from_c(mesh: Mesh, port: int) -> int:
    """c (no sidecar) GETs b's pod address on `port`: the status (0: refused), and the
    backend there must have seen it exactly when it answered."""
    path = f"/from-c-{secrets.token_hex(4)}"
    status = await request_from(mesh.pod("c"), f"http://{pod_address('b')}:{port}{path}")
    backend = mesh.backends["b" if port == PORT else "b:other"]
    if status == 200:
        await backend.wait_seen(path)
    else:
        assert path not in backend.paths(), f"{port} answered {status} yet its backend saw it"
    return status


async def wait_chains(mesh: Mesh, until: Callable[[set[str]], bool], what: str) -> None:
    """Until b's Envoy holds a virtualInbound whose chain names satisfy `until`."""

    async def names() -> set[str]:
        inbound = (await mesh.reviews.listeners()).get(INBOUND_LISTENER, {})
        return {chain.get("name", "") for chain in inbound.get("filter_chains", [])}

    await wait_until(
        names, CONVERGE_TIMEOUT, f"b's {INBOUND_LISTENER} {what}",
        until=until, context=mesh.reviews.agent.tail,
    )  # fmt: skip


def plaintext_everywhere(names: set[str]) -> bool:
    """PERMISSIVE throughout: plaintext chains for 9080 and any port, none of a port's own."""
    own = any(name.startswith(f"{INBOUND_LISTENER}|") for name in names)
    return {f"inbound|{PORT}||-plaintext", INBOUND_LISTENER} <= names and not own


async def remove(mesh: Mesh, *names: str) -> None:
    for name in names:
        mesh.api.delete("PeerAuthentication", APP_NAMESPACE, name)
    await wait_chains(mesh, plaintext_everywhere, "to take plaintext again")
    assert await plaintext_from_c(mesh, PORT) == 200
    assert await plaintext_from_c(mesh, OTHER_PORT) == 200


async def frontend_to_reviews(mesh: Mesh) -> None:
    """a's app GETs reviews by name: b's backend sees a's SPIFFE id."""
    path = f"/from-a-{secrets.token_hex(4)}"
    status = await request_from(mesh.pod("a"), f"http://reviews.{APP_NAMESPACE}:{PORT}{path}")
    assert status == 200, f"a -> reviews answered {status}"
    seen = await mesh.backends["b"].wait_seen(path)
    assert seen.xfcc_field("URI") == FRONTEND.spiffe_id, f"reviews saw XFCC {seen.xfcc!r}"


async def test_a_workload_policy_makes_reviews_strict_in_a_permissive_namespace(
    mesh: Mesh,
) -> None:
    assert await plaintext_from_c(mesh, PORT) == 200, "PERMISSIVE to begin with"
    mesh.api.apply(policy("reviews-strict", "STRICT", selector=True))
    try:
        await wait_chains(
            mesh, lambda names: not any(n == INBOUND_LISTENER or "-plaintext" in n for n in names),
            "to drop its plaintext chains (workload STRICT)",
        )  # fmt: skip
        assert await plaintext_from_c(mesh, PORT) == 0, "STRICT: plaintext reached 9080"
        assert await plaintext_from_c(mesh, OTHER_PORT) == 0, "STRICT: plaintext reached 9081"
        await frontend_to_reviews(mesh)
    finally:
        await remove(mesh, "reviews-strict")


async def test_a_strict_namespace_leaves_open_exactly_the_port_it_excepts(mesh: Mesh) -> None:
    mesh.api.apply(policy("default", "STRICT", ports={PORT: "PERMISSIVE"}))
    try:
        await wait_chains(
            mesh, lambda names: f"inbound|{PORT}||-plaintext" in names
            and INBOUND_LISTENER not in names, "to take plaintext on 9080 only",
        )  # fmt: skip
        assert await plaintext_from_c(mesh, PORT) == 200, "9080 was left PERMISSIVE"
        assert await plaintext_from_c(mesh, OTHER_PORT) == 0, "STRICT: plaintext reached 9081"
        await frontend_to_reviews(mesh)
    finally:
        await remove(mesh, "default")


async def test_a_port_made_strict_in_a_permissive_namespace_refuses_plaintext(
    mesh: Mesh,
) -> None:
    mesh.api.apply(policy("reviews-9081", "UNSET", selector=True, ports={OTHER_PORT: "STRICT"}))
    try:
        await wait_chains(
            mesh, lambda names: f"{INBOUND_LISTENER}|{OTHER_PORT}-mtls" in names
            and f"{INBOUND_LISTENER}|{OTHER_PORT}" not in names, "to make 9081 STRICT",
        )  # fmt: skip
        assert await plaintext_from_c(mesh, OTHER_PORT) == 0, "STRICT: plaintext reached 9081"
        assert await plaintext_from_c(mesh, PORT) == 200, "9080 stays PERMISSIVE"
    finally:
        await remove(mesh, "reviews-9081")
