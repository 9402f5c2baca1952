"""A real Envoy follows what the real endpoint controllers publish for a scaled Deployment.

A Deployment (apps/v1) and a Service selecting it; the test kubelet runs each Pod the
ReplicaSet controller creates. pilot watches as its own ServiceAccount (ready, `/ready`
200, once started: its informers have listed), a real Envoy holds what pilot serves.
Scaled 1 -> 3 -> 2, the hosts follow the EndpointSlice controller's slices (or, with
`--endpoints-api endpoints`, the Endpoints controller's objects): the Pod a scale down
deletes is first terminating, which a slice says (still serving: Envoy holds it
DRAINING) and Endpoints do not (it leaves at once), and leaves once its kubelet is
done. A Pod failing readiness leaves and comes back; at zero replicas the cluster
stays, with no host. None of that updates a cluster (Envoy's CDS updates and the
cluster responses pilot wrote stay as they were): only EDS moves. A second Service is
a cluster more, deleted a cluster less. A presence monitor polls Envoy all along: an
endpoint that still exists never leaves it.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from pilot.kube.config import EndpointsApi
from pilot.xds import types
from tests.cluster.client import Kube, admin, path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.envoy_hosts import EnvoyHosts, healthy, running_envoy
from tests.cluster.kubelet import set_ready
from tests.cluster.workloads import (
    Kubelet,
    Obj,
    address,
    deployment,
    ensure_account,
    scale,
    service,
    watching_pilot,
)
from tests.support.envoy_view import assert_nothing_rejected_or_warming
from tests.support.kube_helpers import ready_status
from tests.support.pilot import RunningPilot

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
VARIANTS = [
    pytest.param("envoy-ads-delta.yaml", EndpointsApi.ENDPOINTSLICES, id="delta-endpointslices"),
    pytest.param("envoy-ads-sotw.yaml", EndpointsApi.ENDPOINTS, id="sotw-endpoints"),
]


class Scene:
    """One test's cluster, pilot and Envoy, and what Envoy must hold."""

    def __init__(
        self, kubelet: Kubelet, pilot: RunningPilot, hosts: EnvoyHosts, slices: bool
    ) -> None:
        self.kube, self.namespace, self.kubelet = kubelet.kube, kubelet.namespace, kubelet
        self.pilot = pilot
        self.hosts = hosts
        self.slices = slices  # EndpointSlices say "terminating"; Endpoints cannot

    async def cluster_updates(self) -> tuple[object, int]:
        """(CDS updates Envoy accepted, cluster responses pilot wrote)."""
        return await self.hosts.cds_updates(), self.pilot.discovery.stats.responses[types.CLUSTER]

    async def scale(self, replicas: int) -> None:
        await scale(self.kube, self.namespace, "alpha", replicas)


async def cheapest_to_delete(kube: Kube, pod: Obj) -> None:
    """The ReplicaSet controller deletes this Pod first when scaling down."""
    meta = pod["metadata"]
    path = path_of("Pod", meta["namespace"], meta["name"])
    await kube.merge_patch(path, {"metadata": {"annotations": {DELETION_COST: "-100"}}})


async def scale_up_then_down(scene: Scene, first: Obj) -> list[Obj]:
    """1 -> 3 -> 2 replicas; the Pods left."""
    hosts, kubelet = scene.hosts, scene.kubelet
    await scene.scale(3)
    pods = await kubelet.run_replicas("alpha", 3)
    hosts.expect("scaled up", alpha=healthy(*pods))
    await hosts.converge("three Pods")

    going = next(p for p in pods if p["metadata"]["name"] != first["metadata"]["name"])
    staying = [p for p in pods if p is not going]
    await cheapest_to_delete(scene.kube, going)
    draining = {address(going): "DRAINING"} if scene.slices else {}
    hosts.expect("scaled down", alpha=healthy(*staying) | draining)
    await scene.scale(2)
    (terminating,) = await kubelet.terminating("alpha", 1)
    assert terminating["metadata"]["name"] == going["metadata"]["name"]
    await hosts.converge("the terminating Pod draining (a slice) or gone (Endpoints)")
    hosts.expect("deletion finished", alpha=healthy(*staying))
    await kubelet.finish([terminating])
    await hosts.converge("the deleted Pod gone")
    return staying


async def readiness_flip(scene: Scene, pods: list[Obj]) -> None:
    scene.hosts.expect("not ready", alpha=healthy(pods[0]))
    unready = await set_ready(scene.kube, pods[1], False)
    await scene.hosts.converge("a Pod failing readiness gone")
    await set_ready(scene.kube, unready, True)
    scene.hosts.expect("ready again", alpha=healthy(*pods))
    await scene.hosts.converge("the Pod back once ready")


async def second_service(scene: Scene, pods: list[Obj]) -> None:
    await scene.kube.create(service("beta", scene.namespace, app="alpha"))
    scene.hosts.expect("a second Service", beta=healthy(*pods))
    await scene.hosts.converge("a cluster for the new Service")
    await scene.kube.delete(service("beta", scene.namespace))
    scene.hosts.expect("the second Service deleted", beta=None)
    await scene.hosts.converge("the deleted Service's cluster gone")


async def to_zero(scene: Scene) -> None:
    scene.hosts.expect("to zero", alpha={})
    await scene.scale(0)
    await scene.kubelet.finish(await scene.kubelet.terminating("alpha", 2))
    await scene.hosts.converge("no host, the cluster kept")


@pytest.mark.envoy
@pytest.mark.parametrize(("example", "endpoints_api"), VARIANTS)
async def test_envoy_follows_a_scaled_deployment(
    deployed: ControlPlane,
    namespace: str,
    tmp_path: Path,
    example: str,
    endpoints_api: EndpointsApi,
) -> None:
    async with AsyncExitStack() as stack:
        kube = await stack.enter_async_context(admin(deployed))
        await ensure_account(kube, namespace)
        await kube.create(deployment("alpha", namespace, replicas=1))
        await kube.create(service("alpha", namespace))
        kubelet = Kubelet(kube, namespace)
        (first,) = await kubelet.run_replicas("alpha", 1)
        pilot = await stack.enter_async_context(
            watching_pilot(kube, deployed, tmp_path, (namespace,), endpoints_api=endpoints_api)
        )
        assert await ready_status(pilot.http_port) == 200, "started, so synced: ready"
        envoy = await stack.enter_async_context(running_envoy(pilot, tmp_path, example))
        hosts = EnvoyHosts(envoy, namespace)
        scene = Scene(kubelet, pilot, hosts, endpoints_api is EndpointsApi.ENDPOINTSLICES)
        hosts.expect("start", alpha=healthy(first))
        await hosts.converge("the Deployment's one Pod")
        async with hosts.monitor as monitor:
            before = await scene.cluster_updates()
            pods = await scale_up_then_down(scene, first)
            await readiness_flip(scene, pods)
            assert await scene.cluster_updates() == before, "endpoint-only changes"
            await second_service(scene, pods)
            before = await scene.cluster_updates()
            await to_zero(scene)
            assert await scene.cluster_updates() == before, "endpoint-only changes"
        await monitor.assert_never_lost()
        await assert_nothing_rejected_or_warming(envoy)
