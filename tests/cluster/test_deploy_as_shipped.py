"""pilot deployed from deploy/ as is, on a real API server with Istio's CRDs installed.

`kubectl apply -k deploy/` with the built kubectl; pilot then runs as the Deployment's
container would (tests.cluster.in_cluster: its args and env, the ServiceAccount's bound
token at the in-cluster path) and must become ready with exactly deploy/rbac.yaml's
permissions (keeping its webhook configuration's caBundle among them). With one rule of
the ClusterRole taken away, pilot says in one line which
permission it lacks, and stays unready.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tests.cluster.client import admin, path_of
from tests.cluster.control_plane import REPO, ControlPlane
from tests.cluster.discovery import shared_root
from tests.cluster.in_cluster import deployment_pod, start_in_cluster
from tests.cluster.injector import bundles
from tests.support.envoy_process import wait_until
from tests.support.pilot_process import PilotProcess, wait_serving

NAMESPACE = "pilot-system"
POD_IP = "10.244.0.10"
READY_TIMEOUT = 30.0


async def _ready_status(pilot: PilotProcess) -> int:
    status, _ = await pilot.get("/ready")
    return status


async def _start(plane: ControlPlane, folder: Path) -> PilotProcess:
    """pilot as the Deployment's container, not waited for."""
    async with admin(plane) as kube:
        deployment = await kube.get(path_of("Deployment", NAMESPACE, "pilot"))
        pod = await deployment_pod(kube, NAMESPACE, "pilot", POD_IP)
        return await start_in_cluster(kube, plane, deployment, pod, folder)


async def test_pilot_as_shipped_becomes_ready(deployed: ControlPlane, tmp_path: Path) -> None:
    pilot = await _start(deployed, tmp_path)
    try:
        await wait_serving(pilot)
        await wait_until(
            lambda: _ready_status(pilot), READY_TIMEOUT, "pilot's /ready to answer 200",
            until=lambda status: status == 200, context=pilot.tail,
        )  # fmt: skip
        forbidden = pilot.logged(lambda e: "forbidden" in e["msg"].lower())
        assert forbidden == [], f"pilot was refused: {forbidden}"
        # deploy/rbac.yaml lets it keep its webhook configuration's caBundle at its root
        async with admin(deployed) as kube:
            root = base64.b64encode(await shared_root(kube)).decode()
            await wait_until(
                lambda: bundles(kube), READY_TIMEOUT, "the webhooks' caBundle",
                until=lambda bundles: set(bundles) == {root}, context=pilot.tail,
            )  # fmt: skip
    finally:
        await pilot.stop()


def _without_rule(role: dict[str, Any], resource: str) -> dict[str, Any]:
    rules = [r for r in role["rules"] if resource not in r.get("resources", [])]
    assert len(rules) < len(role["rules"]), f"the ClusterRole has no rule on {resource}"
    return {**role, "rules": rules}


async def test_a_missing_permission_is_named_in_one_line(
    deployed: ControlPlane, tmp_path: Path
) -> None:
    async with admin(deployed) as kube:
        role = await kube.get(path_of("ClusterRole", name="pilot"))
        await kube.replace(_without_rule(role, "pods"))
    try:
        pilot = await _start(deployed, tmp_path)
        try:
            lines = await pilot.wait_logged(
                lambda e: "forbidden" in e["msg"].lower(), "that it was refused",
                within=READY_TIMEOUT,
            )  # fmt: skip
            assert 'cannot list resource "pods"' in lines[0]["msg"], lines[0]["msg"]
            assert "system:serviceaccount:pilot-system:pilot" in lines[0]["msg"]
            assert await _ready_status(pilot) == 503, "ready without seeing Pods"
        finally:
            await pilot.stop()
    finally:
        deployed.kubectl("apply", "-k", str(REPO / "deploy"))
