"""A workload as the kubelet runs it, and the service-account tokens it would be given.

`run_workload` creates a ServiceAccount and a Pod that uses it, and runs the Pod with the
test kubelet (bound to the node, Running and Ready at an address of the test's).
`Workload.token` asks TokenRequest for a token bound to that Pod, as the kubelet does for
a projected `serviceAccountToken` volume; the API server alone decides, by TokenReview,
what such a token is worth.

TokenRequest issues no token shorter than 600 s, so an expired token cannot be waited
for. `signed_again` makes the token the API server would have issued at another time:
a real token's claims with their times moved, signed again with the cluster's own
service-account key (the key kube-apiserver signs with), so TokenReview judges it as
one of its own.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.cluster.client import Kube, path_of
from tests.cluster.kubelet import run_pod
from tests.support.ca import Token

Obj = dict[str, Any]
ISTIO_CA = "istio-ca"  # the audience pilot asks TokenReview for by default
SHORTEST = 600  # seconds: TokenRequest refuses anything shorter (422)


@dataclass(frozen=True)
class Workload:
    """A running Pod and its ServiceAccount."""

    pod: Obj
    account: str

    @property
    def namespace(self) -> str:
        namespace: str = self.pod["metadata"]["namespace"]
        return namespace

    @property
    def name(self) -> str:
        name: str = self.pod["metadata"]["name"]
        return name

    @property
    def ip(self) -> str:
        ip: str = self.pod["status"]["podIP"]
        return ip

    @property
    def spiffe(self) -> str:
        return f"spiffe://cluster.local/ns/{self.namespace}/sa/{self.account}"

    async def token(self, kube: Kube, audience: str = ISTIO_CA, seconds: int = SHORTEST) -> Token:
        """A token for `audience` bound to this Pod, as the kubelet asks for one."""
        return Token(await kube.token(self.namespace, self.account, [audience], seconds, self.pod))


def service_account(namespace: str, name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace}}  # fmt: skip


async def run_workload(
    kube: Kube, namespace: str, name: str, ip: str, account: str = "workload"
) -> Workload:
    """The ServiceAccount `account` (created unless there) and Pod `name` running as it."""
    status, _ = await kube.request("GET", path_of("ServiceAccount", namespace, account))
    if status == 404:
        await kube.create(service_account(namespace, account))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "serviceAccountName": account,
            "containers": [{"name": "app", "image": "app", "ports": [{"containerPort": 8080}]}],
        },
    }
    return Workload(await run_pod(kube, pod, ip), account)


def _unpadded(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _decoded(part: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def signed_again(token: str, signing_key: Path, shift: int = 0) -> Token:
    """`token` with its exp, iat and nbf moved by `shift` seconds, signed again (RS256)
    with `signing_key`, the header (its key id) kept."""
    header, payload, _ = token.split(".")
    claims = _decoded(payload)
    for claim in ("exp", "iat", "nbf"):
        claims[claim] += shift
    signed = f"{header}.{_unpadded(json.dumps(claims).encode())}"
    key = serialization.load_pem_private_key(signing_key.read_bytes(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey), "kube-apiserver's key here is RSA"
    signature = key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
    return Token(f"{signed}.{_unpadded(signature)}")
