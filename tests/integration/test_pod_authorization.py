"""AuthorizationPolicy on real pods through real Envoys: what a client is let through.

One set-up for the module (tests/integration/mesh_pods.py): pod `b` runs the reviews
backend on 9080 behind its sidecar, and here a second backend on 9081, a port no
service names (TCP passthrough); pod `a` (service account `frontend`) reaches reviews
by name over mTLS through both Envoys; pod `c` has no sidecar and sends plaintext
straight to b's address (bookinfo is PERMISSIVE). Policies are applied to the test
API server that pilot watches; each test waits until b's Envoy holds its rules, and
deletes them after.

1. `spec: {}` (allow nothing): HTTP gets 403 `RBAC: access denied`, TCP is closed;
2. ALLOW from a's service account lets a in, and neither c (plaintext: no principal)
   nor a once the ALLOW names another service account;
3. DENY beats ALLOW; a DENY on a path holds against `..` and percent-encoded
   letters (normalized first), another case, `%2F` and a doubled slash (the DENY's
   paths are widened to them; tests/integration/test_pod_paths.py has the rest).
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
)
from tests.support.envoy_process import wait_until
from tests.support.pod_process import running_in
from tests.support.pods import Pod

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

OTHER_PORT = 9081  # b's second backend: no service names it (a passthrough chain, TCP)
KIND = "AuthorizationPolicy"
DENIED_BODY = "RBAC: access denied"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    async with mesh_pods(tmp_path_factory.mktemp("pod-authorization")) as running:
        argv = [sys.executable, "-m", "tests.integration.http_backend", "--host", "0.0.0.0"]
        argv += ["--port", str(OTHER_PORT)]
        async with running_in(
            running.pod("b"), argv, "serving on", uid=APP_UID, cwd=REPO
        ) as process:
            running.backends["b:other"] = Backend(running.pod("b"), process)
            yield running
        running.assert_nothing_restarted()
        # Every listener pilot sent with RBAC filters was taken: b's Envoy rejected none.
        assert await running.reviews.stat("listener_manager.lds.update_rejected") in (0, None)
        assert await running.reviews.stat("listener_manager.lds.update_success")


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": KIND,
        "metadata": {"name": name, "namespace": APP_NAMESPACE},
        "spec": spec,
    }


REVIEWS = {"matchLabels": {"app": "reviews"}}


async def get(pod: Pod, url: str) -> tuple[int, str]:
    """curl in `pod` as the app, the path sent as written: (status, body); 0 if closed."""
    argv = ["curl", "-sS", "--path-as-is", "--max-time", "5", "-w", "\n%{http_code}", url]
    _, out, _ = await pod.run(*argv, uid=APP_UID)
    body, _, code = out.rpartition("\n")
    return (int(code) if code.strip().isdigit() else 0), body


async def from_a(mesh: Mesh, path: str) -> tuple[int, str]:
    """a's app GETs reviews by name (mTLS through both sidecars); a 200 must reach b."""
    status, body = await get(mesh.pod("a"), f"http://reviews.{APP_NAMESPACE}:{PORT}{path}")
    if status == 200:
        await mesh.backends["b"].wait_seen(path)
    return status, body


async def settled_from_a(mesh: Mesh, path: str, status: int) -> tuple[int, str]:
    """`from_a` until it answers `status`: a's sidecar keeps its connections to b, and
    those stay on the chains they began on until b's Envoy drains them (a few seconds
    after its listener changed), so the first requests after a change may be old ones."""
    url = f"http://reviews.{APP_NAMESPACE}:{PORT}{path}"
    return await wait_until(
        lambda: get(mesh.pod("a"), url), CONVERGE_TIMEOUT, f"a -> reviews{path} to answer {status}",
        until=lambda answer: answer[0] == status, context=mesh.reviews.agent.tail,
    )  # fmt: skip


async def from_c(mesh: Mesh, port: int) -> int:
    """c (no sidecar) GETs b's pod address: the status, 0 when the connection closed."""
    path = f"/from-c-{secrets.token_hex(4)}"
    status, _ = await get(mesh.pod("c"), f"http://{pod_address('b')}:{port}{path}")
    backend = mesh.backends["b" if port == PORT else "b:other"]
    if status != 200:
        assert path not in backend.paths(), f"{port} answered {status} yet its backend saw it"
    return status


async def inbound_text(mesh: Mesh) -> str:
    """b's virtualInbound as its Envoy holds it, as text."""
    return str((await mesh.reviews.listeners()).get("virtualInbound", {}))


async def wait_inbound(mesh: Mesh, holds: Callable[[str], bool], what: str) -> None:
    """Until b's Envoy holds a virtualInbound that `holds`, and no connection is left on
    the chains it replaced (a's sidecar keeps its connections to b; those stay on the
    chains they began on until b's Envoy has drained them)."""
    await wait_until(
        lambda: inbound_text(mesh), CONVERGE_TIMEOUT, f"b's virtualInbound {what}",
        until=holds, context=mesh.reviews.agent.tail,
    )  # fmt: skip
    await wait_until(
        lambda: mesh.reviews.stats("^listener_manager\\.total_(filter_chains|listeners)_draining$"),
        CONVERGE_TIMEOUT, "b's replaced chains to drain",
        until=lambda draining: len(draining) == 2 and not any(draining.values()),
        context=mesh.reviews.agent.tail,
    )  # fmt: skip


async def wait_rules(mesh: Mesh, *present: str) -> None:
    """Until b's virtualInbound names the rules of these policies."""
    await wait_inbound(
        mesh, lambda text: all(f"policy[{n}]" in text for n in present), f"to hold {present}"
    )


async def wait_open(mesh: Mesh, *names: str) -> None:
    """Delete the policies; until b takes every client again."""
    for name in names:
        mesh.api.delete(KIND, APP_NAMESPACE, name)
    await wait_inbound(mesh, lambda text: "rbac" not in text, "to drop its RBAC filters")
    await settled_from_a(mesh, f"/open-{secrets.token_hex(4)}", 200)


async def test_allow_nothing_refuses_http_with_403_and_closes_tcp(mesh: Mesh) -> None:
    assert (await from_a(mesh, "/before"))[0] == 200
    assert await from_c(mesh, OTHER_PORT) == 200, "9081 open to begin with"
    mesh.api.apply(policy("allow-nothing", {}))
    try:
        # An ALLOW policy without rules has no Envoy policy of its own: wait for the filter.
        await wait_inbound(mesh, lambda text: "rbac" in text, "to hold RBAC filters")
        assert (await settled_from_a(mesh, "/nothing", 403)) == (403, DENIED_BODY)
        assert await from_c(mesh, PORT) == 403
        assert await from_c(mesh, OTHER_PORT) == 0, "TCP under allow-nothing was not closed"
    finally:
        await wait_open(mesh, "allow-nothing")


async def test_allow_from_a_service_account_lets_only_it_in(mesh: Mesh) -> None:
    principal = f"cluster.local/ns/{FRONTEND.namespace}/sa/{FRONTEND.service_account}"
    rule = {"from": [{"source": {"principals": [principal]}}]}
    mesh.api.apply(policy("frontend-only", {"selector": REVIEWS, "rules": [rule]}))
    try:
        await wait_rules(mesh, "frontend-only")
        await settled_from_a(mesh, "/in", 200)  # connections from allow-nothing drain
        assert await from_c(mesh, PORT) == 403, "plaintext (no principal) was let in"
        other = {"from": [{"source": {"principals": ["cluster.local/ns/frontend/sa/other"]}}]}
        mesh.api.apply(policy("frontend-only", {"selector": REVIEWS, "rules": [other]}))
        await wait_inbound(mesh, lambda text: "sa/other" in text, "to name sa/other")
        assert (await settled_from_a(mesh, "/out", 403)) == (403, DENIED_BODY)
    finally:
        await wait_open(mesh, "frontend-only")


async def test_deny_beats_allow_and_holds_against_normalized_paths(mesh: Mesh) -> None:
    mesh.api.apply(policy("allow-all", {"selector": REVIEWS, "rules": [{}]}))
    deny = {"to": [{"operation": {"paths": ["/deny"]}}]}
    mesh.api.apply(policy("deny-path", {"action": "DENY", "rules": [deny]}))
    try:
        await wait_rules(mesh, "allow-all", "deny-path")
        assert (await settled_from_a(mesh, "/deny", 403)) == (403, DENIED_BODY)
        assert (await settled_from_a(mesh, "/a/../deny", 403)) == (403, DENIED_BODY)
        assert (await settled_from_a(mesh, "/%64eny", 403)) == (403, DENIED_BODY)
        assert (await settled_from_a(mesh, "/./deny", 403)) == (403, DENIED_BODY)
        # Istio's default normalization (BASE) keeps case, `%2F` and doubled slashes; a
        # DENY's paths match those spellings too (pilot.builders.path_matchers).
        for path in ("/DENY", "/%2Fdeny", "//deny"):
            status, _ = await get(mesh.pod("a"), f"http://reviews.{APP_NAMESPACE}:{PORT}{path}")
            assert status == 403, f"{path}: {status}"
        assert (await from_a(mesh, f"/allowed-{secrets.token_hex(4)}"))[0] == 200
    finally:
        await wait_open(mesh, "allow-all", "deny-path")
