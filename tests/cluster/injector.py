"""pilot as the cluster's sidecar injector, for tests that create Pods on the real API
server and want them injected (tests.cluster.test_injection_webhook, and any test that
runs injected Pods).

`running_injector` starts `pilot discovery` as pilot's ServiceAccount under deploy/'s
RBAC (tests.cluster.discovery.start_discovery: the shared root, POD_NAMESPACE
pilot-system, so its webhook certificate names pilot.pilot-system.svc), routes the
Service pilot's ClusterIP:443 to its webhook port through the API server's egress proxy
(tests.cluster.cluster_network), and waits until pilot has written its root into every
webhook's caBundle of deploy/'s MutatingWebhookConfiguration: from then on a Pod the
webhooks select comes back injected. `deploy/` must be applied (the `deployed` fixture).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.cluster.client import Kube, admin, path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.discovery import start_discovery
from tests.cluster.in_cluster import PILOT_NAMESPACE
from tests.support.envoy_process import wait_until
from tests.support.pilot_process import PilotProcess

CONFIGURATION = "pilot-sidecar-injector"  # deploy/sidecar-injector.yaml
WEBHOOK_PORT = 443  # the Service's https-webhook port, as the webhooks name it
TIMEOUT = 30.0


async def bundles(kube: Kube) -> list[str]:
    """Every webhook's caBundle (base64), '' where none."""
    path = path_of("MutatingWebhookConfiguration", name=CONFIGURATION)
    configuration = await kube.get(path)
    return [w["clientConfig"].get("caBundle", "") for w in configuration["webhooks"]]


async def wait_bundles(kube: Kube, pilot: PilotProcess) -> None:
    """Until every webhook's caBundle is pilot's root."""
    root = base64.b64encode(pilot.root_pem).decode()
    await wait_until(
        lambda: bundles(kube), TIMEOUT, "every caBundle to be pilot's root",
        until=lambda found: found and all(b == root for b in found), context=pilot.tail,
    )  # fmt: skip


@asynccontextmanager
async def running_injector(
    plane: ControlPlane, folder: Path, *flags: str
) -> AsyncIterator[PilotProcess]:
    """pilot, its webhook reachable at its Service, the caBundle written; stopped on exit.
    `flags`: more of `pilot discovery`'s (the injection flags, say)."""
    async with admin(plane) as kube:
        service = await kube.get(path_of("Service", PILOT_NAMESPACE, "pilot"))
        pilot = await start_discovery(kube, plane, folder, *flags)
        try:
            with plane.network.route(
                service["spec"]["clusterIP"], WEBHOOK_PORT, pilot.webhook_port
            ):
                await wait_bundles(kube, pilot)
                yield pilot
        finally:
            await pilot.stop()


def container_names(pod: dict[str, Any]) -> list[str]:
    """The init containers' names, then the containers'."""
    spec = pod["spec"]
    return [c["name"] for c in [*spec.get("initContainers", []), *spec["containers"]]]


def injected(pod: dict[str, Any]) -> bool:
    """Whether the Pod (as the API server stored it) carries pilot's sidecar."""
    names = container_names(pod)
    return "istio-proxy" in names and "istio-init" in names
