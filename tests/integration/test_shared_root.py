"""One trust root for all replicas: the Secret, the Lease, and replicas that cannot read it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from pathlib import Path

from aiohttp import web

from tests.harness.envoy_process import wait_until
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.mesh import simple_mesh
from tests.support.pilot import running_kube_pilot

SECRET_PATH = "/api/v1/namespaces/default/secrets/pilot-ca-secret"


async def test_replicas_started_together_share_one_root(tmp_path: Path) -> None:
    async with KubeAPIServer() as api:
        for obj in simple_mesh({"a": ["127.0.0.1"]}):
            api.apply(obj)
        configs = []
        for name in ("one", "two"):
            (tmp_path / name).mkdir()
            configs.append(write_kubeconfig(tmp_path / name / "kubeconfig", api.url))
        first, second = running_kube_pilot(configs[0]), running_kube_pilot(configs[1])
        pilot_one, pilot_two = await asyncio.gather(first.__aenter__(), second.__aenter__())
        try:
            roots = {p.discovery.security.ca.root_pem for p in (pilot_one, pilot_two)}  # type: ignore[union-attr]
            assert len(roots) == 1, "both replicas sign under one root"
            secret = api.get("Secret", "default", "pilot-ca-secret")
            assert secret is not None
            stored = base64.b64decode(secret["data"]["root-cert.pem"]).decode()
            assert roots == {stored}
            assert len([r for r in api.requests if r.method == "POST" and "secrets" in r.path]) <= 2
            electors = [p.discovery.security.elector for p in (pilot_one, pilot_two)]  # type: ignore[union-attr]
            await wait_until(
                lambda: sum(e.is_leader for e in electors if e) == 1, 10, "exactly one Lease holder"
            )
            leader = next(e for e in electors if e and e.is_leader)
            lease = api.get("Lease", "default", "pilot-ca")
            assert lease is not None and lease["spec"]["holderIdentity"] == leader.identity
        finally:
            await asyncio.gather(
                first.__aexit__(None, None, None), second.__aexit__(None, None, None)
            )
        lease = api.get("Lease", "default", "pilot-ca")
        assert lease is not None and not lease["spec"].get("holderIdentity"), "released on shutdown"


async def test_a_replica_that_cannot_read_the_root_does_not_sign(tmp_path: Path) -> None:
    refused: list[str] = []

    async def forbidden(request: web.Request) -> web.Response:
        refused.append(request.path)
        return web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Forbidden",
                "code": 403,
                "message": 'secrets "pilot-ca-secret" is forbidden',
            },
            status=403,
        )

    route = web.get(SECRET_PATH, forbidden)
    async with KubeAPIServer(extra_routes=[route]) as api:
        for obj in simple_mesh({"a": ["127.0.0.1"]}):
            api.apply(obj)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        starting = asyncio.create_task(running_kube_pilot(kubeconfig).__aenter__())
        await wait_until(lambda: len(refused) >= 3, 10, "pilot to keep asking for the root")
        assert not starting.done(), "no CA, no signing: pilot waits for the root"
        assert api.get("Secret", "default", "pilot-ca-secret") is None, "and creates none"
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
