"""ConfigMap `istio-ca-root-cert` as a user sees it on the real API server.

`holds` says whether one holds exactly a root (the data key `root-cert.pem` and nothing
else, no binaryData); `wait_published` waits until it does in each of some namespaces;
`RootWrites` watches every such ConfigMap from a resourceVersion taken before it is
entered and records each change, by namespace, in the order the API server made them:
what pilot wrote (and what the test did), read from the server's own history rather
than counted at the client (a write the server refused leaves no trace there).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import aiohttp
from cryptography import x509

from tests.cluster.client import Kube, path_of
from tests.support.background import BackgroundLoop
from tests.support.envoy_process import wait_until

Obj = dict[str, Any]
CONFIGMAP = "istio-ca-root-cert"
KEY = "root-cert.pem"
WAIT = 20.0  # pilot's first list of Namespaces, then one write per namespace
_BY_NAME = f"fieldSelector=metadata.name%3D{CONFIGMAP}"


def holds(configmap: Obj | None, root_pem: bytes) -> bool:
    """Exactly one data key, `root-cert.pem`, holding exactly the root; nothing else."""
    if configmap is None or configmap.get("binaryData"):
        return False
    data = configmap.get("data") or {}
    if set(data) != {KEY}:
        return False
    try:
        found = x509.load_pem_x509_certificates(data[KEY].encode())
    except ValueError:
        return False
    return found == x509.load_pem_x509_certificates(root_pem)


async def published(kube: Kube, namespace: str) -> Obj | None:
    """The namespace's istio-ca-root-cert, or None."""
    status, configmap = await kube.request("GET", path_of("ConfigMap", namespace, CONFIGMAP))
    return configmap if status == 200 else None


async def wait_published(
    kube: Kube, namespaces: Iterable[str], root_pem: bytes, within: float = WAIT
) -> None:
    """Wait until every one of `namespaces` holds exactly `root_pem`."""
    wanted = sorted(namespaces)

    async def missing() -> list[str]:
        return [ns for ns in wanted if not holds(await published(kube, ns), root_pem)]

    await wait_until(missing, within, f"{CONFIGMAP} to hold the root in {wanted}",
                     until=lambda left: left == [])  # fmt: skip


class RootWrites(BackgroundLoop):
    """Every ADDED, MODIFIED and DELETED of an istio-ca-root-cert after `start`, by
    namespace, in the API server's order."""

    what = f"watch of {CONFIGMAP}"

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.events: dict[str, list[str]] = defaultdict(list)
        self._since = ""

    async def __aenter__(self) -> RootWrites:
        listed = await self.kube.get(f"/api/v1/configmaps?{_BY_NAME}")
        self._since = listed["metadata"]["resourceVersion"]
        await super().__aenter__()
        return self

    def of(self, namespace: str) -> list[str]:
        return list(self.events.get(namespace, []))

    async def seen(self, namespace: str, count: int) -> list[str]:
        """The namespace's changes, once the watch has delivered at least `count` (a
        change the API server already shows may still be on its way to the watch)."""
        changes: list[str] = await wait_until(
            lambda: self.of(namespace), WAIT, f"{count} changes of {namespace}'s {CONFIGMAP}",
            until=lambda found: len(found) >= count,
        )  # fmt: skip
        return changes

    async def _run(self) -> None:
        url = f"{self.kube.plane.url}/api/v1/configmaps?watch=1&{_BY_NAME}"
        url += f"&resourceVersion={self._since}"
        unbounded = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.kube.session.get(url, timeout=unbounded) as answer:
            assert answer.status == 200, f"watch: HTTP {answer.status}"
            async for line in answer.content:
                event = json.loads(line)
                assert event["type"] != "ERROR", f"watch: {event['object'].get('message')}"
                self.events[event["object"]["metadata"]["namespace"]].append(event["type"])
        raise AssertionError("the API server ended the watch: later writes would go unseen")
