"""The sidecar bench's real API server: etcd and kube-apiserver, with the mesh written on it.

`start_cluster` starts tests.cluster's control plane (RBAC, TLS, an admin's
kubeconfig) without its controller manager: the mesh's Services select their
Pods, and the EndpointSlice controller would write slices of its own beside
the mesh's (every endpoint twice). Nothing else of the controller manager's is
needed: the bench writes the ServiceAccounts the Pods name itself, and the
mesh's slices say they are managed by the bench.

`ClusterApi` is `bench.kube.KubeApi` on that server (TLS, the admin's client
certificate), so `bench.kube.Watch` times each change from the real server's
watch event, as pilot's and istiod's informers get it. `load` writes the mesh
with concurrent requests, in the order a cluster has them: ServiceAccounts,
Pods (then their status, as a kubelet writes it: Running, Ready, the Pod's
IP; istiod holds back an endpoint whose Pod it has not seen and reads a
sidecar's labels from the Pod at its IP), Services, EndpointSlices.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.kube import KubeApi
from tests.cluster.client import Kube
from tests.cluster.control_plane import ControlPlane, running_control_plane
from tests.cluster.kubelet import set_ready

Obj = dict[str, Any]
CONCURRENCY = 32  # requests in flight while loading: the API server's two cores stay busy


class ClusterApi(KubeApi):
    """An admin's session to the real API server, with what `bench.kube.Watch` uses."""

    def __init__(self, plane: ControlPlane) -> None:  # no super(): another session
        self.url = plane.url
        connector = aiohttp.TCPConnector(ssl=plane.ssl_context(), limit=CONCURRENCY)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None)
        )
        self.kube = Kube(plane, self.session)

    async def resource_version(self) -> str:
        """The store's current revision (a list read from etcd carries it)."""
        listed = await self.kube.get("/api/v1/namespaces?limit=1")
        return str(listed["metadata"]["resourceVersion"])

    async def apply(self, obj: dict[str, Any]) -> str:
        """Server-side apply of one object; its new resourceVersion."""
        applied = await self.kube.apply(obj)
        return str(applied["metadata"]["resourceVersion"])

    async def delete(self, obj: Obj) -> None:
        await self.kube.delete(obj)


@contextlib.contextmanager
def start_cluster(folder: Path) -> Iterator[ControlPlane]:
    """etcd and the API server under `folder` (no controller manager), stopped on exit."""
    folder.mkdir()
    with running_control_plane(folder, controllers=False) as plane:
        yield plane


async def load(api: ClusterApi, objects: Sequence[Obj]) -> float:
    """Write the mesh's objects, kind by kind in a cluster's order; the seconds it took."""
    started = time.monotonic()
    by_kind: dict[str, list[Obj]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    accounts = {pod["spec"]["serviceAccountName"] for pod in by_kind.get("Pod", [])}
    await _each(api.kube.create, (_account(name) for name in sorted(accounts)))
    await _each(lambda pod: _run_pod(api.kube, pod), by_kind.get("Pod", []))
    for kind in ("Service", "EndpointSlice"):
        await _each(api.kube.create, by_kind.get(kind, []))
    return time.monotonic() - started


async def _each(write: Callable[[Obj], Awaitable[Any]], objects: Iterable[Obj]) -> None:
    """`write` every object, CONCURRENCY at a time; the first failure fails the load."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(obj: Obj) -> None:
        async with gate:
            await write(obj)

    async with asyncio.TaskGroup() as group:
        for obj in objects:
            group.create_task(one(obj))


async def _run_pod(kube: Kube, pod: Obj) -> None:
    """Create the Pod, then write its status as its kubelet would (the API server drops a
    status sent with the create)."""
    await kube.create(pod)
    await set_ready(kube, pod, True)


def _account(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": "default"},
    }
