"""The shared root's Secret when it is wrong: unusable contents, or a replica that cannot read it.

(Replicas on one cluster electing one Lease holder, which alone creates the Secret, are
tested on the real API server: tests/cluster/test_shared_root_replicas.py.)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web

from pilot.security.ca import CaSetupError
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.ca import Issuer, new_ca, utcnow
from tests.support.envoy_process import wait_until
from tests.support.mesh import simple_mesh
from tests.support.pilot import running_kube_pilot

SECRET_PATH = "/api/v1/namespaces/default/secrets/pilot-ca-secret"
DAY = datetime.timedelta(days=1)


def _ca_secret(key_pem: bytes, cert_pem: str) -> dict[str, object]:
    data = {"ca-cert.pem": cert_pem.encode(), "ca-key.pem": key_pem, "root-cert.pem": cert_pem}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pilot-ca-secret", "namespace": "default"},
        "type": "Opaque",
        "data": {
            name: base64.b64encode(value if isinstance(value, bytes) else value.encode()).decode()
            for name, value in data.items()
        },
    }


def _pair(issuer: Issuer) -> tuple[bytes, str]:
    return issuer.key_pem, issuer.cert_pem


def _mismatched() -> tuple[bytes, str]:
    return new_ca("another").key_pem, new_ca("shared root").cert_pem


UNUSABLE_SECRETS: dict[str, tuple[Callable[[], tuple[bytes, str]], str]] = {
    "key-mismatch": (
        _mismatched,
        "Secret default/pilot-ca-secret ca-key.pem is not the key of"
        " Secret default/pilot-ca-secret ca-cert.pem",
    ),
    "not-a-ca": (
        lambda: _pair(new_ca("a leaf", is_ca=False)),
        "Secret default/pilot-ca-secret ca-cert.pem is not a CA certificate",
    ),
    "expired": (
        lambda: _pair(new_ca("old root", valid_for=DAY, starts=utcnow() - 3 * DAY)),
        "Secret default/pilot-ca-secret ca-cert.pem expired at",
    ),
}


@pytest.mark.parametrize("fault", UNUSABLE_SECRETS, ids=list(UNUSABLE_SECRETS))
async def test_an_unusable_shared_root_stops_pilot(tmp_path: Path, fault: str) -> None:
    """A Secret someone wrote by hand must hold a CA pilot can sign with: else pilot stops,
    naming the Secret, and does not replace it."""
    make, expected = UNUSABLE_SECRETS[fault]
    key_pem, cert_pem = make()
    async with KubeAPIServer() as api:
        api.apply(_ca_secret(key_pem, cert_pem))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        with pytest.raises(CaSetupError) as caught:
            async with running_kube_pilot(kubeconfig):
                pytest.fail("pilot started with an unusable CA root")
        assert str(caught.value).startswith(expected)
        secret = api.get("Secret", "default", "pilot-ca-secret")
        assert secret is not None
        kept = base64.b64decode(secret["data"]["ca-cert.pem"]).decode() == cert_pem
        assert kept, "the Secret was replaced"


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
