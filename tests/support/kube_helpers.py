"""Shared pieces of the Kubernetes-registry integration tests (`test_kube_*.py`).

Owns:

* `kube_api`: a started test API server (`tests.kubeapi.KubeAPIServer`) plus a kubeconfig
  pointing at it, the way a user points pilot at a cluster;
* the mesh model the tests edit (`KubeMesh`: service name -> endpoints), turned into
  Services plus EndpointSlices or legacy v1 Endpoints (`mesh_objects`) and into the
  view Envoy must end up with (`expected_view`);
* `MeshDriver`: applies each edit of the mesh to the API server and keeps the
  presence monitors told which endpoints must never disappear from Envoy;
* `PresenceMonitor`: a background poller of Envoy's `/clusters?format=json` that
  records every moment an endpoint that still exists is missing from Envoy;
* small readers of what pilot did (`list_requests`, `relists`, `ready_status`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from pilot.kube.informer import Informer
from pilot.sources.kubernetes.cluster_source import ClusterSource
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.background import BackgroundLoop
from tests.support.envoy_process import XDS_CLUSTER, EnvoyProcess, wait_until
from tests.support.envoy_view import ClusterView, wait_for_view
from tests.support.mesh import Ep, cluster_name, endpoint_slice, service
from tests.support.pilot import RunningPilot

Obj = dict[str, Any]
KubeMesh = dict[str, list[Ep]]  # service name -> its endpoints (one slice / Endpoints each)
HostRef = tuple[str, str, int]  # (cluster, ip, port) as Envoy lists it

SERVICE_PORT = 80
TARGET_PORT = 8080
ENDPOINT_KINDS = ("EndpointSlice", "Endpoints")


# ------------------------------------------------------------------ API server


@asynccontextmanager
async def kube_api(tmp_path: Path) -> AsyncIterator[tuple[KubeAPIServer, Path]]:
    """A running test API server and a kubeconfig file pointing at it."""
    async with KubeAPIServer() as srv:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig.yaml", srv.url)
        yield srv, kubeconfig


# ------------------------------------------------------------------ mesh model


def ready(*ips: str) -> list[Ep]:
    """Ready endpoints at these IPs."""
    return [Ep(ip) for ip in ips]


def legacy_endpoints(name: str, endpoints: Iterable[Ep], namespace: str = "default") -> Obj:
    """A v1 Endpoints object: ready endpoints under addresses, the others under
    notReadyAddresses; no subset at all when there is no endpoint (as the controller does)."""
    eps = list(endpoints)
    subset: Obj = {"ports": [{"name": "http", "port": TARGET_PORT, "protocol": "TCP"}]}
    addresses = [{"ip": ep.ip} for ep in eps if ep.ready is not False]
    not_ready = [{"ip": ep.ip} for ep in eps if ep.ready is False]
    if addresses:
        subset["addresses"] = addresses
    if not_ready:
        subset["notReadyAddresses"] = not_ready
    return {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": name, "namespace": namespace},
        "subsets": [subset] if eps else [],
    }


def mesh_objects(mesh: KubeMesh, namespace: str = "default", legacy: bool = False) -> list[Obj]:
    """Each service as a Service plus one EndpointSlice (or one legacy Endpoints)."""
    objects: list[Obj] = []
    for name, eps in mesh.items():
        objects.append(service(name, namespace, ports=(("http", SERVICE_PORT),)))
        if legacy:
            objects.append(legacy_endpoints(name, eps, namespace))
        else:
            objects.append(endpoint_slice(name, eps, namespace, ports=(("http", TARGET_PORT),)))
    return objects


def _health(ep: Ep) -> str | None:
    """What Envoy must show for an endpoint: ready -> HEALTHY, terminating but still
    serving -> DRAINING, otherwise absent. A missing condition counts as true
    (ready) or as "same as ready" (serving), as in Kubernetes."""
    is_ready = ep.ready is not False
    if is_ready:
        return "HEALTHY"
    if ep.serving and ep.terminating:
        return "DRAINING"
    return None


def expected_view(mesh: KubeMesh, namespace: str = "default") -> ClusterView:
    """One cluster per service, even with no host; its hosts with their EDS health."""
    view: ClusterView = {}
    for name, eps in mesh.items():
        hosts = {(ep.ip, TARGET_PORT): h for ep in eps if (h := _health(ep)) is not None}
        view[cluster_name(name, SERVICE_PORT, namespace)] = hosts
    return view


def hosts_of(view: ClusterView) -> frozenset[HostRef]:
    return frozenset((cluster, ip, port) for cluster, hosts in view.items() for ip, port in hosts)


def apply_mesh(
    srv: KubeAPIServer, mesh: KubeMesh, namespace: str = "default", legacy: bool = False
) -> None:
    """Make the API server's services and endpoints in `namespace` equal to `mesh`, in
    one go (no await): gone services lose their endpoints object first, then the Service."""
    endpoints_kind = "Endpoints" if legacy else "EndpointSlice"
    wanted = {(o["kind"], o["metadata"]["name"]) for o in mesh_objects(mesh, namespace, legacy)}
    for kind in (endpoints_kind, "Service"):
        for obj in srv.objects(kind, namespace):
            if (kind, obj["metadata"]["name"]) not in wanted:
                srv.delete(kind, namespace, obj["metadata"]["name"])
    for obj in mesh_objects(mesh, namespace, legacy):
        srv.apply(obj)


# ------------------------------------------------------------------ monitoring


async def envoy_hosts(envoy: EnvoyProcess) -> frozenset[HostRef]:
    """Every (cluster, ip, port) Envoy holds, from one consistent /clusters?format=json."""
    found: set[HostRef] = set()
    for status in (await envoy.clusters()).get("cluster_statuses", []):
        name = status.get("name")
        if name == XDS_CLUSTER:
            continue
        for host in status.get("host_statuses", []):
            socket_address = host.get("address", {}).get("socket_address")
            if socket_address is not None:
                found.add((name, socket_address["address"], int(socket_address["port_value"])))
    return frozenset(found)


SAMPLES_WITHIN = 10.0  # for a presence monitor's few samples of a converged Envoy


class PresenceMonitor(BackgroundLoop):
    """Polls one Envoy's clusters in the background and records every sample in which
    an endpoint that must be there is missing.

    Which endpoints must be there is told by the test (through `MeshDriver`): `narrow`
    when a change starts (only what exists both before and after it stays required) and
    `require` once Envoy has been seen to hold the new state. A sample is judged against
    the intersection of everything required while it was being taken, so a change that
    starts in the middle of a sample never counts as a loss.
    """

    def __init__(self, envoy: EnvoyProcess, required: ClusterView, interval: float = 0.03):
        self.envoy = envoy
        self.interval = interval
        self.phase = "start"
        self.samples = 0
        self.gaps: list[str] = []
        self._required = hosts_of(required)
        self._window: set[HostRef] | None = None
        self.what = f"presence monitor of {envoy.name}"

    def narrow(self, hosts: frozenset[HostRef], phase: str) -> None:
        """A change starts: from now on only `hosts` (and what was required) must stay."""
        self.phase = phase
        self._required = self._required & hosts
        if self._window is not None:
            self._window &= hosts

    def require(self, hosts: frozenset[HostRef]) -> None:
        """Envoy has been seen holding `hosts`: from now on they must all stay."""
        self._required = hosts

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            self._window = set(self._required)
            present = await envoy_hosts(self.envoy)
            window, self._window = self._window, None
            missing = window - present
            if missing:
                at = loop.time() - started
                self.gaps.append(f"{at:.3f}s [{self.phase}] missing {sorted(missing)}")
            self.samples += 1
            await asyncio.sleep(self.interval)  # the polling period, not a synchronisation

    async def assert_never_lost(self, min_samples: int = 5) -> None:
        """Envoy never lacked an endpoint that existed (and that pilot had delivered).

        While the monitor runs, it first takes `min_samples` samples if it has not yet:
        a sequence that converged quickly leaves it few, and more samples of the state
        converged to can find a loss but never hide one."""
        if self._task is not None and not self._task.done():
            await wait_until(
                lambda: self.samples,
                SAMPLES_WITHIN,
                f"{min_samples} samples of {self.envoy.name}'s clusters",
                until=lambda n: n >= min_samples,
            )
        assert self.samples >= min_samples, f"only {self.samples} samples of Envoy's clusters"
        assert self.gaps == [], (
            f"Envoy lost endpoints that still existed in {len(self.gaps)} of "
            f"{self.samples} samples:\n" + "\n".join(self.gaps[:20])
        )


class MeshDriver:
    """The mesh the API server holds; each edit goes to the API server and narrows what
    the monitors require, each convergence (`converge`) widens it again."""

    def __init__(
        self,
        srv: KubeAPIServer,
        mesh: KubeMesh,
        *,
        namespace: str = "default",
        legacy: bool = False,
    ) -> None:
        self.srv = srv
        self.namespace = namespace
        self.legacy = legacy
        self.monitors: list[PresenceMonitor] = []
        self.mesh: KubeMesh = copy.deepcopy(mesh)
        apply_mesh(srv, self.mesh, namespace, legacy)

    def expected(self) -> ClusterView:
        return expected_view(self.mesh, self.namespace)

    def monitor(self, envoy: EnvoyProcess) -> PresenceMonitor:
        """A presence monitor for `envoy`, requiring the current state (call once Envoy
        has converged to it) and kept informed of every later edit."""
        monitor = PresenceMonitor(envoy, self.expected())
        self.monitors.append(monitor)
        return monitor

    def set(self, mesh: Mapping[str, Sequence[Ep]], what: str) -> None:
        """Make `mesh` the API server's state, in one go; the monitors then require only
        what is in both the old and the new state."""
        new = {name: list(eps) for name, eps in mesh.items()}
        keep = hosts_of(expected_view(new, self.namespace))
        for monitor in self.monitors:
            monitor.narrow(keep, what)
        self.mesh = new
        apply_mesh(self.srv, self.mesh, self.namespace, self.legacy)

    def edit(self, what: str, **services: Sequence[Ep] | None) -> None:
        """Change some services (None deletes one), keep the others."""
        mesh = copy.deepcopy(self.mesh)
        for name, eps in services.items():
            if eps is None:
                mesh.pop(name, None)
            else:
                mesh[name] = list(eps)
        self.set(mesh, what)

    async def converge(self, envoys: Iterable[EnvoyProcess], what: str) -> None:
        """Wait until every Envoy holds exactly the current mesh; then it must all stay."""
        expected = self.expected()
        for envoy in envoys:
            await wait_for_view(envoy, expected, what)
        for monitor in self.monitors:
            monitor.require(hosts_of(expected))


# ------------------------------------------------------------------ what pilot did


def informers(pilot: RunningPilot) -> list[Informer]:
    source = pilot.discovery.source
    assert isinstance(source, ClusterSource)
    return source.informers


def relists(pilot: RunningPilot) -> dict[str, int]:
    """Informer kind -> how many times it listed again after its first list."""
    return {informer.kind: informer.relists for informer in informers(pilot)}


def list_requests(srv: KubeAPIServer, *kinds: str) -> dict[str, int]:
    """Kind -> how many list (not watch) requests the API server has received for it."""
    return {kind: len(srv.requests_for(kind, watch=False)) for kind in kinds}


async def ready_status(port: int) -> int:
    """The status of pilot's GET /ready."""
    timeout = aiohttp.ClientTimeout(total=5.0)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}/ready") as response,
    ):
        return response.status
