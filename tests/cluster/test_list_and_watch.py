"""pilot's informers on the real API server: pages, watch ends, bookmarks, 410.

- A list in pages: more Services than pilot's page size, all of them served.
- The server ends each watch at the timeout pilot asked for; pilot watches again from
  where it was, without listing, and sees every change across the ends, even after
  etcd was compacted under it: the API server's watch cache still holds that history.
  Changes pilot does not watch (another namespace's: pilot, told `--namespaces`, holds
  and serves nothing of it) move the server on past pilot's resume point; the server
  says so with bookmarks (pilot asks for them): counted (`pilot_k8s_watch_bookmarks`),
  never taken for objects (nothing rejected).
- A restarted API server's watch cache starts at etcd's current revision (compacted
  too): pilot's next watches get the real 410 ("too old resource version", an ERROR
  event), every informer lists again, and a real Envoy loses no endpoint meanwhile;
  what changes afterwards reaches it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from pilot.kube.config import InformerSettings
from pilot.xds import types
from tests.cluster.client import Kube, admin, path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.envoy_hosts import EnvoyHosts, healthy, running_envoy
from tests.cluster.workloads import (
    SERVICE_PORT,
    Kubelet,
    Obj,
    deployment,
    ensure_account,
    per_kind,
    scale,
    service,
    watching_pilot,
)
from tests.support.envoy_process import wait_until
from tests.support.mesh import cluster_name
from tests.support.pilot import FAST_INFORMER, RunningPilot
from tests.support.xds_client import DeltaStream, XdsClient, node

KINDS = ("Service", "EndpointSlice", "Pod", "Node", "PeerAuthentication")  # pilot's informers
SERVICE_NAME = "kubernetes.io/service-name"  # the label on a Service's EndpointSlices
PAGE = 5
SERVICES = 2 * PAGE + 2  # three pages
# The server ends each watch after 3 or 4 s (pilot's jitter), with a bookmark 2 s before.
SHORT_WATCHES = InformerSettings(watch_timeout=3.0, backoff_initial=0.05, backoff_max=0.5)
TIMEOUT = 30.0


def clusters_of(namespace: str, *names: str) -> set[str]:
    return {cluster_name(name, SERVICE_PORT, namespace) for name in names}


async def clusters_held(
    stream: DeltaStream, namespace: str, until: Callable[[set[str]], bool], what: str
) -> set[str]:
    """The clusters of `namespace` a delta stream holds (ACKing as Envoy does), once
    `until` says so."""

    async def held() -> set[str]:
        for response in await stream.ack_pending():
            assert response.type_url == types.CLUSTER
        suffix = f".{namespace}.svc.cluster.local"
        return {name for name in stream.held.get(types.CLUSTER, {}) if name.endswith(suffix)}

    return await wait_until(held, TIMEOUT, what, until=until)


async def cluster_stream(client: XdsClient) -> DeltaStream:
    stream = client.delta_ads(
        node("router~10.244.9.9~gw.pilot-system~pilot-system.svc.cluster.local")
    )
    await stream.subscribe(types.CLUSTER, ["*"])
    return stream


async def test_every_page_of_a_list_is_served(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    names = [f"svc-{i:02d}" for i in range(SERVICES)]
    paged = InformerSettings(page_size=PAGE, backoff_initial=0.05, backoff_max=0.5)
    async with admin(deployed) as kube:
        for name in names:
            await kube.create(service(name, namespace))
        async with (
            watching_pilot(kube, deployed, tmp_path, (namespace,), informer=paged) as pilot,
            XdsClient(pilot.grpc_target) as client,
        ):
            stream = await cluster_stream(client)
            expected = clusters_of(namespace, *names)
            await clusters_held(stream, namespace, expected.__eq__, f"{SERVICES} Services")


async def restarts_after(pilot: RunningPilot, at_least: dict[str, int]) -> dict[str, int]:
    """Each informer's watch restarts, once each is at `at_least` (its kind's)."""
    return await wait_until(
        lambda: per_kind(pilot, "pilot_k8s_watch_restarts"), TIMEOUT,
        f"watches ended by the server: {at_least}",
        until=lambda seen: all(seen[kind] >= at_least[kind] for kind in KINDS),
    )  # fmt: skip


@pytest.fixture
def elsewhere(control_plane: ControlPlane) -> Iterator[str]:
    """A second namespace, which pilot does not watch."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false")


async def slices_of(kube: Kube, namespace: str, name: str) -> list[Obj]:
    path = path_of("EndpointSlice", namespace) + f"?labelSelector={SERVICE_NAME}={name}"
    items: list[Obj] = (await kube.get(path))["items"]
    return items


async def test_watches_the_server_ends_resume_from_its_history(
    deployed: ControlPlane, namespace: str, elsewhere: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        kube = await stack.enter_async_context(admin(deployed))
        await kube.create(service("a", namespace))
        pilot = await stack.enter_async_context(
            watching_pilot(kube, deployed, tmp_path, (namespace,), informer=SHORT_WATCHES)
        )
        client = await stack.enter_async_context(XdsClient(pilot.grpc_target))
        stream = await cluster_stream(client)
        await clusters_held(stream, namespace, clusters_of(namespace, "a").__eq__, "a")

        ended = await restarts_after(pilot, dict.fromkeys(KINDS, 1))
        await kube.create(service("b", namespace))
        await wait_until(lambda: slices_of(kube, namespace, "b"), TIMEOUT, "b's EndpointSlice")
        # Changes pilot does not watch move the server's Services and EndpointSlices on:
        # pilot's watches of those hear of it as bookmarks only.
        await kube.create(service("b", elsewhere))
        deployed.compact()  # what pilot resumes from is gone from etcd
        # The watch open now ends, and the one after it (from before the compaction) too.
        await restarts_after(pilot, {kind: ended[kind] + 2 for kind in KINDS})
        await kube.create(service("c", namespace))
        await kube.delete(service("a", namespace))
        expected = clusters_of(namespace, "b", "c")
        await clusters_held(stream, namespace, expected.__eq__, "every change, in order")
        held = stream.held[types.CLUSTER]
        assert not [name for name in held if name.endswith(f".{elsewhere}.svc.cluster.local")]
        assert {key.namespace for key in pilot.discovery.index.services} == {namespace}

        assert await per_kind(pilot, "pilot_k8s_relists") == {}, "listed again"
        bookmarks = await per_kind(pilot, "pilot_k8s_watch_bookmarks")
        assert bookmarks["Service"] >= 1, bookmarks
        assert bookmarks["EndpointSlice"] >= 1, bookmarks
        assert await per_kind(pilot, "pilot_k8s_rejected") == {}, "a bookmark taken for an object"


async def move_on(kube: Kube, namespace: str) -> None:
    """A write pilot does not watch: etcd's revision passes every informer's."""
    other = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "moved-on", "namespace": namespace}}  # fmt: skip
    await kube.create(other)


async def test_a_restarted_api_server_answers_410_and_pilot_relists(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        kube = await stack.enter_async_context(admin(deployed))
        await ensure_account(kube, namespace)
        await kube.create(deployment("alpha", namespace, replicas=2))
        await kube.create(service("alpha", namespace))
        pods = await Kubelet(kube, namespace).run_replicas("alpha", 2)
        pilot = await stack.enter_async_context(
            watching_pilot(kube, deployed, tmp_path, (namespace,), informer=FAST_INFORMER)
        )
        envoy = await stack.enter_async_context(
            running_envoy(pilot, tmp_path, "envoy-ads-delta.yaml")
        )
        hosts = EnvoyHosts(envoy, namespace)
        hosts.expect("start", alpha=healthy(*pods))
        await hosts.converge("the Deployment's Pods")
        async with hosts.monitor as monitor:
            await move_on(kube, namespace)
            deployed.compact()
            deployed.restart_apiserver()
            await asyncio.to_thread(deployed.wait_ready)
            await wait_until(
                lambda: per_kind(pilot, "pilot_k8s_relists"), TIMEOUT, "every informer relisting",
                until=lambda seen: all(seen[kind] >= 1 for kind in KINDS),
            )  # fmt: skip
            async with admin(deployed) as again:  # the old session's connections died
                await scale(again, namespace, "alpha", 3)
                pods = await Kubelet(again, namespace, block=1).run_replicas("alpha", 3)
            hosts.expect("scaled up after the restart", alpha=healthy(*pods))
            await hosts.converge("the Pod added after the relist")
        await monitor.assert_never_lost()
