"""Workloads on the real control plane, as a test declares them, and pilot watching them.

Owns the objects a test applies (a Deployment, apps/v1, with the Service that selects
it; a plain Pod; a ServiceAccount), the kubelet's part for Pods that controllers create
(`Kubelet`: runs each new Pod of an app at the next address of the test's range, and
finishes a graceful deletion, which only a kubelet does), and `watching_pilot`: pilot
in this process (its stats and informers readable) watching the test's namespace
through a kubeconfig as its own ServiceAccount, so deploy/'s RBAC is proved enough;
`per_kind` reads one of its per-kind counters off `/metrics`, as an operator would.

Addresses are the test's choice (10.244.0.0/16, a pod network's): nothing connects to
them, they are what the real EndpointSlice controller publishes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.client import Kube, admin, path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.in_cluster import PILOT_NAMESPACE, pilot_kubeconfig
from tests.cluster.kubelet import NODE, remove_pod, run_pod
from tests.support.envoy_process import wait_until
from tests.support.pilot import RunningPilot, running_kube_pilot
from tests.support.xds_client import DeltaStream, XdsClient, node

Obj = dict[str, Any]
APP = "app"  # the label a Deployment's Pods carry and its Service selects
SERVICE_PORT = 80
TARGET_PORT = 8080
TLS_MODE = "security.istio.io/tlsMode"
CONTROLLER_TIMEOUT = 30.0  # the controllers act within a second; a loaded machine is slower
SHARED_ROOT = (("Lease", "pilot-ca"), ("Secret", "pilot-ca-secret"))  # pilot's, in its namespace


def pod_template(app: str, account: str = "default", labels: dict[str, str] | None = None) -> Obj:
    """A Pod's metadata and spec: one container serving `TARGET_PORT` (named http)."""
    ports = [{"name": "http", "containerPort": TARGET_PORT}]
    container = {"name": "app", "image": "app", "ports": ports}
    return {
        "metadata": {"labels": {APP: app, **(labels or {})}},
        "spec": {
            "serviceAccountName": account,
            "automountServiceAccountToken": False,
            "containers": [container],
        },
    }


def deployment(name: str, namespace: str, replicas: int, **template: Any) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {APP: name}},
            "template": pod_template(name, **template),
        },
    }


def service(name: str, namespace: str, app: str = "") -> Obj:
    """A ClusterIP Service on port 80 (http) selecting the Pods of `app` (default: `name`)."""
    port = {"name": "http", "port": SERVICE_PORT, "targetPort": TARGET_PORT}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {APP: app or name}, "ports": [port]},
    }


def pod(name: str, namespace: str, app: str, **template: Any) -> Obj:
    """A plain Pod of `app` (no controller owns it)."""
    shape = pod_template(app, **template)
    shape["metadata"] |= {"name": name, "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Pod", **shape}


async def scale(kube: Kube, namespace: str, name: str, replicas: int) -> None:
    path = path_of("Deployment", namespace, name)
    await kube.merge_patch(path, {"spec": {"replicas": replicas}})


async def ensure_account(kube: Kube, namespace: str, name: str = "default") -> None:
    """ServiceAccount `name` exists (the controller makes `default`: wait for it): the API
    server refuses a Pod whose account does not exist."""
    path = path_of("ServiceAccount", namespace, name)
    if name != "default" and (await kube.request("GET", path))[0] == 404:
        account = {"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": name, "namespace": namespace}}  # fmt: skip
        await kube.create(account)

    async def present() -> bool:
        return (await kube.request("GET", path))[0] == 200

    await wait_until(present, CONTROLLER_TIMEOUT, f"ServiceAccount {namespace}/{name}")


class Kubelet:
    """Runs the Pods controllers create, at addresses 10.244.<block>.1, .2, ... in order."""

    def __init__(self, kube: Kube, namespace: str, block: int = 0) -> None:
        self.kube = kube
        self.namespace = namespace
        self._block = block
        self._next = 1

    def next_ip(self) -> str:
        ip = f"10.244.{self._block}.{self._next}"
        self._next += 1
        return ip

    async def pods(self, app: str) -> list[Obj]:
        path = path_of("Pod", self.namespace) + f"?labelSelector={APP}={app}"
        items: list[Obj] = (await self.kube.get(path))["items"]
        return items

    async def run(self, pod: Obj, node: str = NODE) -> Obj:
        """Create (if need be) and run one Pod at the next address, on `node`."""
        return await run_pod(self.kube, pod, self.next_ip(), node)

    async def run_replicas(self, app: str, replicas: int) -> list[Obj]:
        """Wait for the ReplicaSet's `replicas` live Pods of `app`; run those not running
        yet. All of them, running, by name."""

        async def live() -> list[Obj]:
            return [p for p in await self.pods(app) if "deletionTimestamp" not in p["metadata"]]

        pods = await wait_until(
            live, CONTROLLER_TIMEOUT, f"{replicas} Pods of {app}",
            until=lambda found: len(found) == replicas,
        )  # fmt: skip
        running = [p if p["status"].get("podIP") else await self.run(p) for p in pods]
        return sorted(running, key=lambda p: str(p["metadata"]["name"]))

    async def terminating(self, app: str, count: int) -> list[Obj]:
        """The `count` Pods of `app` being deleted gracefully (a scale down does that)."""

        async def deleting() -> list[Obj]:
            return [p for p in await self.pods(app) if "deletionTimestamp" in p["metadata"]]

        return await wait_until(
            deleting, CONTROLLER_TIMEOUT, f"{count} Pods of {app} terminating",
            until=lambda found: len(found) == count,
        )  # fmt: skip

    async def finish(self, pods: list[Obj]) -> None:
        """End graceful deletions as a kubelet does once the containers have stopped."""
        for each in pods:
            await remove_pod(self.kube, each)


def address(pod: Obj) -> str:
    ip: str = pod["status"]["podIP"]
    return ip


def sidecar_id(pod: Obj) -> str:
    """The node id of `pod`'s sidecar, as Istio's agent writes it."""
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    return f"sidecar~{address(pod)}~{name}.{namespace}~{namespace}.svc.cluster.local"


async def _absent(kube: Kube) -> list[tuple[str, str]]:
    found = []
    for kind, name in SHARED_ROOT:
        status, _ = await kube.request("GET", path_of(kind, PILOT_NAMESPACE, name))
        if status == 404:
            found.append((kind, name))
    return found


@asynccontextmanager
async def watching_pilot(
    kube: Kube, plane: ControlPlane, folder: Path, namespaces: tuple[str, ...], **options: Any
) -> AsyncIterator[RunningPilot]:
    """pilot (in this process) on the real API server as its ServiceAccount, watching
    `namespaces`; its shared root in its own namespace, as deployed. The Lease and the
    Secret it creates there are removed afterwards (those found there stay)."""
    kubeconfig = await pilot_kubeconfig(kube, plane, folder / "kubeconfig")
    created = await _absent(kube)
    security = {"namespace": PILOT_NAMESPACE, **options.pop("security", {})}
    try:
        async with running_kube_pilot(
            kubeconfig, namespaces=namespaces, security=security, **options
        ) as pilot:
            yield pilot
    finally:
        for kind, name in created:
            meta = {"name": name, "namespace": PILOT_NAMESPACE}
            await kube.delete({"kind": kind, "metadata": meta})


async def per_kind(pilot: RunningPilot, family: str) -> Counter[str]:
    """Counter `family` of pilot's `/metrics` (its name without `_total`), by kind (summed
    over its other labels; kinds at zero left out)."""
    url = f"http://127.0.0.1:{pilot.http_port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        assert answer.status == 200, f"/metrics answered {answer.status}"
        text = await answer.text()
    counts: Counter[str] = Counter()
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            for sample in metric.samples:
                if sample.name == f"{family}_total":
                    counts[sample.labels["kind"]] += int(sample.value)
    return +counts


class ReviewsSidecar(NamedTuple):
    kube: Kube
    pod: Obj
    pilot: RunningPilot
    stream: DeltaStream


async def reviews_sidecar(
    stack: AsyncExitStack, plane: ControlPlane, namespace: str, folder: Path
) -> ReviewsSidecar:
    """One `reviews` replica behind its Service, run by the test kubelet, a pilot watching
    `namespace`, and a delta ADS stream as that pod's sidecar (nothing subscribed yet);
    all of it closed with `stack`."""
    kube = await stack.enter_async_context(admin(plane))
    await ensure_account(kube, namespace)
    await kube.create(deployment("reviews", namespace, 1))
    await kube.create(service("reviews", namespace))
    (pod,) = await Kubelet(kube, namespace).run_replicas("reviews", 1)
    pilot = await stack.enter_async_context(watching_pilot(kube, plane, folder, (namespace,)))
    client = await stack.enter_async_context(XdsClient(pilot.grpc_target))
    stream = client.delta_ads(node(sidecar_id(pod)))
    return ReviewsSidecar(kube, pod, pilot, stream)
