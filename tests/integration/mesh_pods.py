"""A small mesh of pods (tests/support/pods) that carries real traffic, set up once.

The pods, each a network namespace on one bridge (198.18.0.0/15 only):

- `istiod` (198.18.0.2): the test Kubernetes API server (in this process, its socket
  made inside the pod) and `pilot discovery` on it through a kubeconfig, its TLS xDS
  port 15012 on the pod's address, named `pilot.istio-system.svc` (its certificate's
  name: pilot runs with POD_NAMESPACE=istio-system);
- `a`, the frontend (namespace `frontend`, service account `frontend`, label
  `security.istio.io/tlsMode: istio`): capture rules (`pilot agent iptables`, as root,
  the init step) and `pilot agent --binary-path` as uid 1337 starting Envoy; the app is
  whatever the test runs there as uid 1000 (curl);
- `b`, service `reviews` (namespace `bookinfo`, service account `reviews`): a sidecar
  likewise, and the recording HTTP backend on 9080;
- `c`, service `ratings`: the backend, no sidecar, no label;
- `d` and `e`: backends for the service `details` a test creates later.

Names resolve by hosts entries in every pod (Service name -> ClusterIP in
198.19.0.0/16, as cluster DNS answers), so the app dials `reviews.bookinfo:9080`
and its Host header is the name; nothing routes a ClusterIP but the capture rules
and Envoy (pods without a sidecar dial pod addresses).

`PodEnvoy` reads a sidecar's admin API (127.0.0.1:15000 inside its pod) with
curl; `requests_from` runs the real curl in a pod as the app's uid; `Backend`
reads what a pod's backend says it received (path and x-forwarded-client-cert).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.integration.agent_process import REPO
from tests.integration.http_backend import Seen, parse_seen
from tests.integration.pod_control_plane import PILOT_HOST, start_pilot, start_sidecar
from tests.integration.sidecar_support import Workload, envoy_pid
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot_process import PilotProcess
from tests.support.pod_process import PodProcess, running_in
from tests.support.pods import Pod, PodNetwork, leftovers, pod_network, socket_in

Obj = dict[str, Any]

HTTP_APP = "tests.integration.http_backend"  # the module a pod's backend runs by default
APP_NAMESPACE = "bookinfo"
FRONTEND = Workload("frontend", "frontend", "frontend-6b7f9-a1a1a")
REVIEWS = Workload(APP_NAMESPACE, "reviews", "reviews-v1-5d8f7-b2b2b")
RATINGS = Workload(APP_NAMESPACE, "ratings", "ratings-v1-7c9d4-c3c3c")
DETAILS = (
    Workload(APP_NAMESPACE, "details", "details-v1-4f6a2-d4d4d"),
    Workload(APP_NAMESPACE, "details", "details-v1-4f6a2-e5e5e"),
)
PORT = 9080  # every service's port and its pods' targetPort, named http
APP_UID = 1000
CONVERGE_TIMEOUT = 20.0
CLUSTER_IPS = {"reviews": "198.19.0.10", "ratings": "198.19.0.11", "details": "198.19.0.12"}
POD_NAMES = ("istiod", "a", "b", "c", "d", "e")  # 198.18.0.2 ... .7, in this order
TLS_MODE = "security.istio.io/tlsMode"


def pod_address(name: str) -> str:
    return f"198.18.0.{POD_NAMES.index(name) + 2}"


def cluster_of(service_name: str) -> str:
    return f"outbound|{PORT}||{service_name}.{APP_NAMESPACE}.svc.cluster.local"


def _hosts() -> dict[str, str]:
    names = {PILOT_HOST: pod_address("istiod")}
    for name, address in CLUSTER_IPS.items():
        for host in (f"{name}.{APP_NAMESPACE}", f"{name}.{APP_NAMESPACE}.svc.cluster.local"):
            names[host] = address
    return names


# ------------------------------------------------------------------ Kubernetes objects


def namespace_object(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def service_object(name: str) -> Obj:
    obj = service(name, APP_NAMESPACE, ports=(("http", PORT),))
    obj["spec"]["clusterIP"] = CLUSTER_IPS[name]
    obj["spec"]["selector"] = {"app": name}
    return obj


# The Pod each pod of the mesh is: the slices' targetRefs name it, as Kubernetes writes them.
POD_WORKLOADS = {"a": FRONTEND, "b": REVIEWS, "c": RATINGS, "d": DETAILS[0], "e": DETAILS[1]}


def slice_object(name: str, pods: Iterable[str]) -> Obj:
    endpoints = [Ep(pod_address(pod), pod=POD_WORKLOADS[pod].pod_name) for pod in pods]
    return endpoint_slice(name, endpoints, APP_NAMESPACE, ports=(("http", PORT),))


def pod_object(pod: str, workload: Workload, app: str, sidecar: bool) -> Obj:
    """A running Pod as the kubelet reports it; a sidecar's carries Istio's tlsMode label."""
    labels = {"app": app} | ({TLS_MODE: "istio"} if sidecar else {})
    address = pod_address(pod)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": workload.pod_name, "namespace": workload.namespace, "labels": labels},
        "spec": {
            "serviceAccountName": workload.service_account,
            "containers": [{"name": app, "ports": [{"containerPort": PORT, "protocol": "TCP"}]}],
        },
        "status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]},
    }


def initial_objects() -> list[Obj]:
    """The namespaces, reviews (pod b, a sidecar) and ratings (pod c, none), pod a."""
    return [
        *(namespace_object(name) for name in ("istio-system", FRONTEND.namespace, APP_NAMESPACE)),
        pod_object("a", FRONTEND, "frontend", sidecar=True),
        pod_object("b", REVIEWS, "reviews", sidecar=True),
        pod_object("c", RATINGS, "ratings", sidecar=False),
        service_object("reviews"),
        slice_object("reviews", ["b"]),
        service_object("ratings"),
        slice_object("ratings", ["c"]),
    ]


def details_objects(pods: Sequence[str]) -> list[Obj]:
    """The service `details`, its pods d and e (no sidecar) and a slice naming `pods`."""
    return [
        pod_object("d", DETAILS[0], "details", sidecar=False),
        pod_object("e", DETAILS[1], "details", sidecar=False),
        service_object("details"),
        slice_object("details", pods),
    ]


def peer_authentication(mode: str, namespace: str = APP_NAMESPACE) -> Obj:
    """Istio's namespace-wide PeerAuthentication (no selector)."""
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": {"mtls": {"mode": mode}},
    }


# ------------------------------------------------------------------ reading the pods


async def _checked(pod: Pod, argv: Sequence[str], what: str) -> str:
    status, out, err = await pod.run(*argv)
    assert status == 0, f"{what} in pod {pod.name} exited {status}: {err.strip()[:500]}"
    return out


@dataclass
class PodEnvoy:
    """A sidecar: its pod, the agent that started its Envoy, and that Envoy's admin API."""

    pod: Pod
    agent: PodProcess
    pid: int

    async def admin(self, path: str, **params: str) -> str:
        """GET 127.0.0.1:15000`path` inside the pod (as root: loopback is never captured)."""
        argv = ["curl", "-sS", "--fail", "--max-time", "5", "--get"]
        for key, value in params.items():
            argv += ["--data-urlencode", f"{key}={value}"]
        return await _checked(self.pod, [*argv, f"http://127.0.0.1:15000{path}"], "admin GET")

    async def admin_json(self, path: str, **params: str) -> Any:
        return json.loads(await self.admin(path, **params))

    async def stats(self, regex: str) -> dict[str, int]:
        """Every counter and gauge whose name matches `regex` (RE2, Envoy's filter)."""
        stats = await self.admin_json("/stats", format="json", filter=regex)
        return {
            entry["name"]: int(entry["value"])
            for entry in stats.get("stats", [])
            if isinstance(entry.get("value"), int)
        }

    async def stat(self, name: str) -> int | None:
        """One counter by exact name (None when Envoy has no such stat)."""
        escaped = "".join(f"\\{c}" if not c.isalnum() and c != "_" else c for c in name)
        return (await self.stats(f"^{escaped}$")).get(name)

    async def hosts(self, cluster: str) -> set[tuple[str, int]]:
        """(ip, port) of every host Envoy holds for `cluster`."""
        clusters = await self.admin_json("/clusters", format="json")
        return {
            (address["address"], int(address["port_value"]))
            for status in clusters.get("cluster_statuses", [])
            if status.get("name") == cluster
            for host in status.get("host_statuses", [])
            if (address := host.get("address", {}).get("socket_address")) is not None
        }

    async def listeners(self) -> dict[str, Obj]:
        """Name -> the active listener pilot gave this Envoy."""
        dump = await self.admin_json("/config_dump", resource="dynamic_listeners")
        return {
            entry["name"]: entry["active_state"]["listener"]
            for entry in dump.get("configs", [])
            if "active_state" in entry
        }

    async def clusters(self) -> dict[str, Obj]:
        """Name -> the active cluster pilot gave this Envoy."""
        dump = await self.admin_json("/config_dump", resource="dynamic_active_clusters")
        return {entry["cluster"]["name"]: entry["cluster"] for entry in dump.get("configs", [])}

    async def endpoint_metadata(self, cluster: str) -> dict[str, Obj]:
        """ip -> the filter metadata EDS gave that endpoint of `cluster`."""
        dump = await self.admin_json(
            "/config_dump", resource="dynamic_endpoint_configs", include_eds=""
        )
        return {
            endpoint["endpoint"]["address"]["socket_address"]["address"]: endpoint.get(
                "metadata", {}
            ).get("filter_metadata", {})
            for entry in dump.get("configs", [])
            if entry.get("endpoint_config", {}).get("cluster_name") == cluster
            for locality in entry["endpoint_config"].get("endpoints", [])
            for endpoint in locality.get("lb_endpoints", [])
        }

    async def cluster_stat(self, cluster: str, stat: str) -> int:
        """`cluster.NAME.STAT` (NAME: its alt_stat_name if pilot set one), 0 when absent."""
        config = (await self.clusters()).get(cluster, {})
        return await self.stat(f"cluster.{config.get('alt_stat_name') or cluster}.{stat}") or 0

    async def listener_stat(self, listener: str, stat: str) -> int:
        """`listener.PREFIX.STAT`: PREFIX is the listener's stat_prefix, else its address
        (`0.0.0.0_15006`), as Envoy names them; 0 when absent."""
        config = (await self.listeners()).get(listener, {})
        address = config.get("address", {}).get("socket_address", {})
        prefix = config.get("stat_prefix") or "{}_{}".format(
            address.get("address"), address.get("port_value")
        )
        return await self.stat(f"listener.{prefix}.{stat}") or 0

    async def route_domains(self, route: str) -> set[str]:
        """Every domain of every virtual host of RDS route configuration `route`."""
        dump = await self.admin_json("/config_dump", resource="dynamic_route_configs")
        return {
            domain
            for entry in dump.get("configs", [])
            if entry.get("route_config", {}).get("name") == route
            for host in entry["route_config"].get("virtual_hosts", [])
            for domain in host.get("domains", [])
        }

    async def wait_route(self, service_name: str) -> None:
        """Until RDS route configuration PORT names the service (RDS is pushed last)."""
        domain = f"{service_name}.{APP_NAMESPACE}"
        await wait_until(
            lambda: self.route_domains(str(PORT)), CONVERGE_TIMEOUT,
            f"pod {self.pod.name}'s route {PORT} to name {domain}",
            until=lambda domains: domain in domains, context=self.agent.tail,
        )  # fmt: skip

    async def wait_hosts(self, cluster: str, expected: set[tuple[str, int]], what: str) -> None:
        await wait_until(
            lambda: self.hosts(cluster),
            CONVERGE_TIMEOUT,
            f"pod {self.pod.name}'s Envoy to hold {what}: {cluster} -> {sorted(expected)}",
            until=lambda hosts: hosts == expected,
            context=self.agent.tail,
        )


@dataclass
class Backend:
    """A pod's HTTP backend (tests/integration/http_backend) and what it says it received."""

    pod: Pod
    process: PodProcess

    def seen(self) -> list[Seen]:
        return [seen for line in self.process.lines if (seen := parse_seen(line)) is not None]

    def paths(self) -> set[str]:
        return {seen.path for seen in self.seen()}

    async def wait_seen(self, path: str) -> Seen:
        """The request for `path`, once the backend has printed it (or fail)."""
        await self.process.wait_line(f'"path": "{path}"', within=5.0)
        return next(seen for seen in self.seen() if seen.path == path)


async def requests_from(
    pod: Pod, urls: Sequence[str], uid: int = APP_UID, headers: Sequence[str] = ()
) -> list[int]:
    """GET each URL with curl in `pod` as `uid` (one connection where it can), with
    `headers` ("Name: value"): each status, 0 where nothing answered (refused, reset)."""
    argv = ["curl", "-sS", "--max-time", "5", "-w", "%{http_code}\\n"]
    for header in headers:
        argv += ["-H", header]
    for url in urls:
        argv += ["-o", "/dev/null", url]
    _, out, _ = await pod.run(*argv, uid=uid)
    codes = [int(code) for code in out.split()]
    return codes + [0] * (len(urls) - len(codes))


async def request_from(pod: Pod, url: str, uid: int = APP_UID, headers: Sequence[str] = ()) -> int:
    [code] = await requests_from(pod, [url], uid, headers)
    return code


# ------------------------------------------------------------------ the set-up


@dataclass
class Mesh:
    """Everything the traffic tests use, once it is all up."""

    network: PodNetwork
    api: KubeAPIServer
    pilot: PilotProcess
    frontend: PodEnvoy
    reviews: PodEnvoy
    backends: dict[str, Backend]  # pod name -> its backend

    def pod(self, name: str) -> Pod:
        return self.network[name]

    def assert_nothing_restarted(self) -> None:
        """pilot, both agents and both Envoys are the processes the set-up started."""
        assert self.pilot.alive, f"pilot exited; {self.pilot.tail()}"
        for sidecar in (self.frontend, self.reviews):
            assert sidecar.agent.process.returncode is None, sidecar.agent.tail()
            assert envoy_pid(sidecar.agent) == sidecar.pid, "the agent restarted Envoy"
            starts = sum("started Envoy" in line for line in sidecar.agent.lines)
            assert starts == 1, f"pod {sidecar.pod.name}: Envoy started {starts} times"


async def _backend(stack: AsyncExitStack, pod: Pod, app: str = HTTP_APP) -> Backend:
    argv = [sys.executable, "-m", app, "--host", "0.0.0.0"]
    process = await stack.enter_async_context(
        running_in(pod, [*argv, "--port", str(PORT)], "serving on", uid=APP_UID, cwd=REPO)
    )
    return Backend(pod, process)


async def _sidecar(
    stack: AsyncExitStack, pod: Pod, workload: Workload, pilot: PilotProcess, token: str
) -> PodEnvoy:
    agent = await start_sidecar(stack, pod, workload, pilot, token)
    return PodEnvoy(pod, agent, envoy_pid(agent))


async def _ready(sidecar: PodEnvoy) -> None:
    async def live() -> bool:
        status, _, _ = await sidecar.pod.run(
            "curl", "-s", "-o", "/dev/null", "--fail", "http://127.0.0.1:15000/ready"
        )
        return status == 0

    await wait_until(
        live, CONVERGE_TIMEOUT, f"pod {sidecar.pod.name}'s Envoy to be LIVE",
        context=sidecar.agent.tail,
    )  # fmt: skip


@asynccontextmanager
async def mesh_pods(
    folder: Path,
    *,
    pilot_settings: dict[str, str] | None = None,
    app: str = HTTP_APP,
) -> AsyncIterator[Mesh]:
    """The whole mesh, up and synced; every process, namespace and rule gone afterwards.
    `pilot_settings`: environment variables `pilot discovery` starts with; `app`: the
    module the pods' backends run (one that prints http_backend's `seen` lines)."""
    async with pod_network(POD_NAMES, hosts=_hosts()) as network, AsyncExitStack() as stack:
        if shutil.which("curl") is None:  # after pod_network: it skips where pods cannot be
            pytest.fail("no curl, the pods' app and admin client (Debian: apt-get install curl)")
        api = KubeAPIServer(sock=socket_in(network["istiod"].namespace, "127.0.0.1"))
        await stack.enter_async_context(api)
        kubeconfig = write_kubeconfig(folder / "kubeconfig.yaml", api.url)
        tokens = {w: api.add_service_account_token(w.namespace, w.service_account)
                  for w in (FRONTEND, REVIEWS)}  # fmt: skip
        for obj in initial_objects():
            api.apply(obj)
        source = ["--kubeconfig", str(kubeconfig)]
        pilot = await start_pilot(stack, network["istiod"], folder, source, pilot_settings)
        backends = {
            name: await _backend(stack, network[name], app) for name in ("b", "c", "d", "e")
        }
        frontend = await _sidecar(stack, network["a"], FRONTEND, pilot, tokens[FRONTEND])
        reviews = await _sidecar(stack, network["b"], REVIEWS, pilot, tokens[REVIEWS])
        for sidecar in (frontend, reviews):
            await _ready(sidecar)
        for name, pod in (("reviews", "b"), ("ratings", "c")):
            await frontend.wait_hosts(cluster_of(name), {(pod_address(pod), PORT)}, name)
            await frontend.wait_route(name)
        yield Mesh(network, api, pilot, frontend, reviews, backends)
    assert leftovers(network) == [], "the pods' namespaces or links outlived the test"


def module_mesh(name: str) -> Any:
    """A module's `mesh` fixture: the mesh, set up once for the module's tests (its folder
    named `name`), and checked at the end for a sidecar that restarted."""

    @pytest_asyncio.fixture(scope="module", loop_scope="module")
    async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
        async with mesh_pods(tmp_path_factory.mktemp(name)) as running:
            yield running
            running.assert_nothing_restarted()

    return mesh
