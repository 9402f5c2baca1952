"""What the path tests share (test_pod_paths*.py): the mesh of tests/integration/mesh_pods
with the raw-target app in its pods, requests whose target is sent byte for byte, and
waiting for b's sidecar to hold a set of AuthorizationPolicies.

Requests go to pod b (service reviews, a sidecar) two ways: from c, which has no sidecar
(plaintext to b's address, PERMISSIVE): b's Envoy alone must hold; and from a through
its own sidecar too (mTLS, by the service's name).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.integration.mesh_pods import (
    APP_NAMESPACE,
    APP_UID,
    CONVERGE_TIMEOUT,
    PORT,
    Mesh,
    mesh_pods,
    pod_address,
)
from tests.support.envoy_process import wait_until

KIND = "AuthorizationPolicy"
RAW_APP = "tests.integration.raw_path_backend"
REVIEWS = {"matchLabels": {"app": "reviews"}}
MARKERS = "/marker/"  # what `answers` sends between requests: an ALLOW must let it in


@asynccontextmanager
async def path_mesh(folder: Path, settings: dict[str, str] | None = None) -> AsyncIterator[Mesh]:
    """The mesh, pilot started with `settings`, every pod's app the raw-target one."""
    async with mesh_pods(folder, pilot_settings=settings, app=RAW_APP) as running:
        yield running
        running.assert_nothing_restarted()
        assert await running.reviews.stat("listener_manager.lds.update_rejected") in (0, None)


def policy(name: str, action: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": KIND,
        "metadata": {"name": name, "namespace": APP_NAMESPACE},
        "spec": {"action": action, "selector": REVIEWS, "rules": rules},
    }


def to_paths(field: str, *paths: str) -> list[dict[str, Any]]:
    return [{"to": [{"operation": {field: list(paths)}}]}]


async def send(mesh: Mesh, client: str, target: str, host: str = "") -> int:
    """GET with request target `target` exactly as written, from pod `client` ("a": by
    the service's name through a's sidecar; "c": to b's address): the status, 0 if none."""
    if client == "a":
        url = f"http://reviews.{APP_NAMESPACE}:{PORT}/"
    else:
        url = f"http://{pod_address('b')}:{PORT}/"
    argv = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5"]
    argv += ["--request-target", target, url]
    if host:
        argv += ["-H", f"Host: {host}"]
    _, out, _ = await mesh.pod(client).run(*argv, uid=APP_UID)
    return int(out) if out.strip().isdigit() else 0


async def answers(mesh: Mesh, client: str, targets: Sequence[str]) -> dict[str, tuple[int, str]]:
    """Each target's status and the target b's app received for it ("" when nothing):
    requests are sent one at a time, each followed by a marker b must receive, so what
    the app records between two markers is what that request became (an ALLOW policy
    must let `/marker/*` in)."""
    app = mesh.backends["b"]
    found = {}
    for target in targets:
        before = len(app.seen())
        status = await send(mesh, client, target)
        marker = f"{MARKERS}{secrets.token_hex(4)}"
        assert await send(mesh, client, marker) == 200, f"{marker} from {client} was refused"
        await app.wait_seen(marker)
        got = [seen.path for seen in app.seen()[before:]]
        assert got[-1] == marker and len(got) <= 2, got
        found[target] = (status, got[0] if len(got) == 2 else "")
    return found


async def _inbound(mesh: Mesh) -> str:
    return str((await mesh.reviews.listeners()).get("virtualInbound", {}))


async def hold(mesh: Mesh, *objects: dict[str, Any]) -> None:
    """Apply `objects`; until b's Envoy holds the rules of each, and no connection is
    left on the chains they replaced (a's sidecar keeps its connections to b)."""
    for obj in objects:
        mesh.api.apply(obj)
    names = [f"policy[{obj['metadata']['name']}]" for obj in objects]
    await wait_until(
        lambda: _inbound(mesh), CONVERGE_TIMEOUT, f"b's virtualInbound to hold {names}",
        until=lambda text: all(n in text for n in names), context=mesh.reviews.agent.tail,
    )  # fmt: skip
    await _drained(mesh)


async def release(mesh: Mesh, *objects: dict[str, Any]) -> None:
    """Delete `objects`; until b's Envoy holds no RBAC filter and its old chains drained."""
    for obj in objects:
        mesh.api.delete(KIND, APP_NAMESPACE, obj["metadata"]["name"])
    await wait_until(
        lambda: _inbound(mesh), CONVERGE_TIMEOUT, "b's virtualInbound to drop its RBAC",
        until=lambda text: "rbac" not in text, context=mesh.reviews.agent.tail,
    )  # fmt: skip
    await _drained(mesh)


async def _drained(mesh: Mesh) -> None:
    await wait_until(
        lambda: mesh.reviews.stats("^listener_manager\\.total_(filter_chains|listeners)_draining$"),
        CONVERGE_TIMEOUT, "b's replaced chains to drain",
        until=lambda draining: len(draining) == 2 and not any(draining.values()),
        context=mesh.reviews.agent.tail,
    )  # fmt: skip
