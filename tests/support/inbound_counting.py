"""What the inbound-side counting tests share: the mesh of 40 sidecars the security kinds'
tests count over, and reading one sidecar's delta ADS stream.

The mesh: 20 sidecars in namespace `shop`, 20 in namespaces of their own; sidecar i sits
at the address of service i's endpoint and of its Pod, labelled `app: svc-i`.
"""

from __future__ import annotations

from typing import Any

from pilot.xds import types
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.xds_client import DeltaStream, delta_resources

IN_SHOP = 20
ELSEWHERE = 20
SIDECARS = IN_SHOP + ELSEWHERE
SELECTED = 5  # the sidecar a selecting object picks
TIMEOUT = 30.0


def sidecar_ip(i: int) -> str:
    return f"127.1.{i // 250}.{1 + i % 250}"


def namespace_of(i: int) -> str:
    return "shop" if i < IN_SHOP else f"ns-{i}"


def sidecar_id(i: int) -> str:
    """Sidecar i's node id."""
    ns = namespace_of(i)
    return f"sidecar~{sidecar_ip(i)}~pod-{i}.{ns}~{ns}.svc.cluster.local"


def workloads() -> list[dict[str, Any]]:
    """Each sidecar's service, endpoint and Pod."""
    objects: list[dict[str, Any]] = []
    for i in range(SIDECARS):
        ns = namespace_of(i)
        objects += [
            service(f"svc-{i:03d}", ns),
            endpoint_slice(f"svc-{i:03d}", [Ep(sidecar_ip(i))], ns, name=f"svc-{i:03d}-1"),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"pod-{i}", "namespace": ns, "labels": {"app": f"svc-{i}"}},
                "spec": {"containers": [{"name": "app"}]},
                "status": {"phase": "Running", "podIP": sidecar_ip(i)},
            },
        ]
    return objects


def in_shop(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A `security.istio.io/v1` object of `kind` in namespace `shop`."""
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "shop"},
        "spec": spec,
    }


async def sync_inbound(stream: DeltaStream) -> None:
    """Subscribe to every cluster and listener, and read until the inbound side is held."""
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.LISTENER, ["*"])
    held: set[str] = set()  # the inbound clusters follow once the stream reads listeners
    while not {"virtualInbound", "inbound|8080||"} <= held:
        response = await stream.next_response(TIMEOUT)
        held |= set(delta_resources(response))
        await stream.ack(response)


async def next_change(stream: DeltaStream) -> tuple[str, set[str], set[str]]:
    """One response, acked: its type, the names it sends and those it removes."""
    response = await stream.next_response(TIMEOUT)
    await stream.ack(response)
    return response.type_url, set(delta_resources(response)), set(response.removed_resources)
