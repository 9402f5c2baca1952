"""Support for the replica test (`test_replicas.py`): Envoys that list two pilots.

* `list_pilots`: rewrite a bootstrap's `xds-grpc` cluster to list several pilots, one
  priority level each (the first is preferred), with gRPC health checks so that a pilot
  that says NOT_SERVING (it is draining) or no longer answers is left for the next one;
* `PortMesh`: services whose endpoints carry their own target port (so that one of them
  can front a local backend), applied to the test API server in one go, with the
  `PresenceMonitor`s of `kube_helpers` told which endpoints must never disappear;
* `Traffic`: a paced request loop through an Envoy that records every outcome;
* `CertMonitor`: polls an Envoy's /certs and records every sample in which it lacks an
  unexpired certificate of its own identity, or trusts anything but the one root;
* `proxies_on`: which proxies hold streams to a pilot.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import aiohttp

from tests.integration.envoy_tls_view import ca_certs, own_certs
from tests.kubeapi import KubeAPIServer
from tests.support.background import BackgroundLoop
from tests.support.envoy_process import XDS_CLUSTER, EnvoyProcess, Json
from tests.support.envoy_view import ClusterView, dynamic_clusters
from tests.support.kube_helpers import PresenceMonitor, hosts_of
from tests.support.mesh import Ep, cluster_name, endpoint_slice, service
from tests.support.pilot import RunningPilot

SERVICE_PORT = 80
# Short enough that an Envoy leaves a draining pilot well within its 0.5 s drain.
HEALTH_CHECK_INTERVAL = "0.2s"


# --------------------------------------------------------------------------- bootstrap


def list_pilots(bootstrap: Json, ports: Sequence[int]) -> Json:
    """Make `xds-grpc` list a pilot on each of `ports` (127.0.0.1), in order of preference.

    Each pilot is its own priority level: Envoy opens its xDS streams to the first healthy
    one. Active gRPC health checks (grpc.health.v1, which pilot answers NOT_SERVING from
    the start of its drain) mark a stopping pilot unhealthy, so the streams it closes
    reconnect to the next level.
    """
    bootstrap = copy.deepcopy(bootstrap)
    clusters = bootstrap["static_resources"]["clusters"]
    (xds,) = [cluster for cluster in clusters if cluster["name"] == XDS_CLUSTER]
    xds["load_assignment"]["endpoints"] = [
        {
            "priority": priority,
            "lb_endpoints": [
                {
                    "endpoint": {
                        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}
                    }
                }
            ],
        }
        for priority, port in enumerate(ports)
    ]
    xds["health_checks"] = [
        {
            "timeout": "1s",
            "interval": HEALTH_CHECK_INTERVAL,
            "no_traffic_interval": HEALTH_CHECK_INTERVAL,
            "unhealthy_threshold": 1,
            "healthy_threshold": 1,
            "grpc_health_check": {},
        }
    ]
    return bootstrap


# --------------------------------------------------------------------------- mesh


@dataclass(frozen=True)
class Svc:
    """A service on port 80 whose ready endpoints all listen on `port`."""

    port: int
    ips: tuple[str, ...]


def mesh_view(mesh: Mapping[str, Svc]) -> ClusterView:
    """What an Envoy must hold: one cluster per service, its endpoints HEALTHY."""
    return {
        cluster_name(name, SERVICE_PORT): {(ip, svc.port): "HEALTHY" for ip in svc.ips}
        for name, svc in mesh.items()
    }


async def envoy_mesh_view(envoy: EnvoyProcess) -> ClusterView:
    """The clusters pilot gave `envoy` (its static clusters left out)."""
    view = await dynamic_clusters(envoy)
    return {name: hosts for name, hosts in view.items() if name.startswith("outbound|")}


async def wait_for_mesh_view(envoy: EnvoyProcess, expected: ClusterView, what: str) -> None:
    await envoy.wait_for(
        lambda: envoy_mesh_view(envoy), 15.0, what, until=lambda view: view == expected
    )


class PortMesh:
    """Services and EndpointSlices in the test API server, edited in one go each time."""

    def __init__(self, srv: KubeAPIServer, mesh: Mapping[str, Svc]) -> None:
        self.srv = srv
        self.mesh = dict(mesh)
        self.monitors: list[PresenceMonitor] = []
        self._apply()

    def _apply(self) -> None:
        for name, svc in self.mesh.items():
            self.srv.apply(service(name, ports=(("http", SERVICE_PORT),)))
            endpoints = [Ep(ip) for ip in svc.ips]
            self.srv.apply(endpoint_slice(name, endpoints, ports=(("http", svc.port),)))

    def expected(self) -> ClusterView:
        return mesh_view(self.mesh)

    def monitor(self, envoy: EnvoyProcess) -> PresenceMonitor:
        """A presence monitor requiring the current mesh (Envoy must hold it already)."""
        monitor = PresenceMonitor(envoy, self.expected())
        self.monitors.append(monitor)
        return monitor

    def edit(self, what: str, **services: Svc) -> None:
        """Add or replace services; the monitors then require what is in both states."""
        new = {**self.mesh, **services}
        keep = hosts_of(mesh_view(new))
        for monitor in self.monitors:
            monitor.narrow(keep, what)
        self.mesh = new
        self._apply()

    async def converge(self, envoys: Iterable[EnvoyProcess], what: str) -> None:
        """Wait until every Envoy holds exactly the current mesh; then it must all stay."""
        expected = self.expected()
        for envoy in envoys:
            await wait_for_mesh_view(envoy, expected, what)
        for monitor in self.monitors:
            monitor.require(hosts_of(expected))


# --------------------------------------------------------------------------- pilots


def proxies_on(pilot: RunningPilot) -> collections.Counter[str]:
    """Proxy id -> how many xDS streams it holds to `pilot` right now."""
    return collections.Counter(c.proxy_id for c in pilot.discovery.connections)


# --------------------------------------------------------------------------- traffic


@dataclass(frozen=True)
class Outcome:
    """One request of the loop: when it started (seconds into the loop) and what came back."""

    at: float
    status: int | None
    body: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200


class Traffic:
    """GET `url` + a counter path, one request every `interval` seconds, at most `limit`."""

    def __init__(
        self, url: str, expect_body: str, *, interval: float = 0.1, limit: int = 400
    ) -> None:
        self.url = url
        self.expect_body = expect_body
        self.interval = interval
        self.limit = limit
        self.outcomes: list[Outcome] = []
        self._task: asyncio.Task[None] | None = None
        self._started = 0.0

    @property
    def count(self) -> int:
        return len(self.outcomes)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok or not o.body.startswith(self.expect_body)]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(total=5.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for n in range(self.limit):
                at = loop.time() - self._started
                try:
                    async with session.get(f"{self.url}/tick/{n}") as response:
                        outcome = Outcome(at, response.status, await response.text())
                except (aiohttp.ClientError, TimeoutError) as error:
                    outcome = Outcome(at, None, "", f"{type(error).__name__}: {error}")
                self.outcomes.append(outcome)
                await asyncio.sleep(self.interval)  # the pace of the traffic, not a wait

    def report(self) -> str:
        failed = self.failures
        lines = [f"{len(failed)} of {self.count} requests failed"]
        lines += [f"  {o.at:.3f}s {o.status} {o.error or o.body[:120]!r}" for o in failed[:20]]
        return "\n".join(lines)

    async def __aenter__(self) -> Self:
        self._started = asyncio.get_running_loop().time()
        self._task = asyncio.create_task(self._run(), name="traffic")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        """End the loop (idempotent); a crashed loop is an error."""
        if self._task is None:
            return
        task, self._task = self._task, None
        if task.done():
            task.result()  # the loop ran out of requests or crashed: say which
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --------------------------------------------------------------------------- certificates


class CertMonitor(BackgroundLoop):
    """Polls one Envoy's /certs; records each sample without an unexpired certificate for
    `uri`, or whose trust roots are not exactly `root_serial`. Remembers every leaf serial
    seen, in order."""

    def __init__(
        self, envoy: EnvoyProcess, uri: str, root_serial: int, interval: float = 0.05
    ) -> None:
        self.envoy = envoy
        self.uri = uri
        self.root_serial = root_serial
        self.interval = interval
        self.samples = 0
        self.gaps: list[str] = []
        self.serials: list[int] = []
        self.what = f"certificate monitor of {envoy.name}"

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            mine = [cert for cert in await own_certs(self.envoy) if self.uri in cert.uris]
            roots = {cert.serial for cert in await ca_certs(self.envoy)}
            now = datetime.datetime.now(datetime.UTC)
            valid = [cert for cert in mine if cert.expires > now]
            at = loop.time() - started
            if not valid:
                self.gaps.append(f"{at:.3f}s no unexpired certificate for {self.uri}: {mine}")
            if roots != {self.root_serial}:
                self.gaps.append(f"{at:.3f}s trusts {roots}, not only {self.root_serial}")
            for cert in valid:
                if not self.serials or self.serials[-1] != cert.serial:
                    self.serials.append(cert.serial)
            self.samples += 1
            await asyncio.sleep(self.interval)  # the polling period, not a synchronisation

    def assert_always_valid(self, min_samples: int = 5) -> None:
        assert self.samples >= min_samples, f"only {self.samples} samples of Envoy's /certs"
        assert self.gaps == [], (
            f"Envoy {self.envoy.name} lacked a valid certificate in {len(self.gaps)} of "
            f"{self.samples} samples:\n" + "\n".join(self.gaps[:20])
        )


def reroute(bootstrap: Json, listener: str, cluster: str) -> Json:
    """Send every request of a static listener's single route to `cluster`, which may
    come from pilot later (the static route is not checked against known clusters)."""
    bootstrap = copy.deepcopy(bootstrap)
    for candidate in bootstrap["static_resources"]["listeners"]:
        if candidate["name"] == listener:
            hcm: Any = candidate["filter_chains"][0]["filters"][0]["typed_config"]
            hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] = cluster
            hcm["route_config"]["validate_clusters"] = False
            return bootstrap
    raise ValueError(f"no static listener {listener}")


def drop_static_cluster(bootstrap: Json, name: str) -> Json:
    bootstrap = copy.deepcopy(bootstrap)
    clusters = bootstrap["static_resources"]["clusters"]
    bootstrap["static_resources"]["clusters"] = [c for c in clusters if c["name"] != name]
    return bootstrap
