"""Bookinfo's reviews and ratings in pods (tests/support/pods), for istio.io's traffic
tasks, set up once.

The pods, each a network namespace on one bridge (198.18.0.0/15 only):

- `istiod` (198.18.0.2): `pilot discovery --config mesh.yaml` (the registry file,
  rewritten by each test, reloaded on change), its TLS xDS port 15012 on the pod's
  address, the agents' tokens proven by `--token-auth-file`;
- `product`, productpage's pod (198.18.0.3, namespace `default`): capture rules and `pilot agent`
  starting Envoy as uid 1337; the app is the curl a test runs there as uid 1000;
- `rv1`, `rv2`, `rv3` (.4, .5, .6): pods of the Service `reviews` (9080,
  labels `version: v1` ...), each running the recording backend
  (tests/integration/http_backend) that answers with its version (`reviews-v2`);
  a test may restart one to fail or slow down. As in bookinfo, reviews-v2 calls
  ratings (`http://ratings:9080/ratings/0`) before it answers, through a sidecar of
  its own (capture rules and `pilot agent`, service account `bookinfo-reviews`);
  v1 and v3 have no sidecar and call nothing;
- `ratings` (.7): the Service `ratings`' one pod, `ratings-v1` (`version: v1`), the
  recording backend answering `ratings-v1`, no sidecar.

Names resolve by hosts entries (reviews, ratings -> their ClusterIPs), so the apps dial
`reviews:9080` and `ratings:9080`, as bookinfo's do; nothing routes a ClusterIP but
the capture rules and Envoy.
"""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from tests.integration.agent_process import REPO
from tests.integration.mesh_pods import PodEnvoy
from tests.integration.pod_control_plane import PILOT_HOST, start_pilot, start_sidecar
from tests.integration.sidecar_support import Workload, envoy_pid
from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, endpoint_slice, pod, service, write_mesh
from tests.support.pilot_process import PilotProcess
from tests.support.pod_process import PodProcess, running_in
from tests.support.pods import Pod, PodNetwork, leftovers, pod_network

Obj = dict[str, Any]

NAMESPACE = "default"
PORT = 9080
APP_UID = 1000
CONVERGE_TIMEOUT = 20.0
REVIEWS_IP = "198.19.0.10"
RATINGS_IP = "198.19.0.11"
VERSIONS = ("v1", "v2", "v3")
# Short: a pod's name ends its links' names, cut at 15 characters.
POD_NAMES = ("istiod", "product", "rv1", "rv2", "rv3", "ratings")
PRODUCTPAGE = Workload(NAMESPACE, "bookinfo-productpage", "productpage-v1-7d6cf-a1a1a")
TOKEN = "productpage-token-for-the-registry-file-mesh"
REVIEWS_V2 = Workload(NAMESPACE, "bookinfo-reviews", "reviews-v2")
REVIEWS_V2_TOKEN = "reviews-v2-token-for-the-registry-file-mesh"
REVIEWS_HOST = f"reviews.{NAMESPACE}.svc.cluster.local"
RATINGS_HOST = f"ratings.{NAMESPACE}.svc.cluster.local"
URL = f"http://reviews:{PORT}/reviews/0"
RATINGS_URL = f"http://ratings:{PORT}/ratings/0"
# What each reviews backend does besides answering: v2 calls ratings, as bookinfo's does.
BACKEND_OPTIONS: dict[str, tuple[str, ...]] = {"v2": ("--call", RATINGS_URL)}


def pod_address(name: str) -> str:
    return f"198.18.0.{POD_NAMES.index(name) + 2}"


def subset_cluster(version: str, host: str = REVIEWS_HOST) -> str:
    return f"outbound|{PORT}|{version}|{host}"


def _service(name: str, cluster_ip: str, pods: dict[str, str]) -> list[Obj]:
    """Service `name` at `cluster_ip` and its slice: an endpoint per pod (name -> address)."""
    obj = service(name, NAMESPACE, (("http", PORT),))
    obj["spec"]["clusterIP"] = cluster_ip
    endpoints = [Ep(address, pod=pod_name) for pod_name, address in pods.items()]
    return [obj, endpoint_slice(name, endpoints, NAMESPACE, (("http", PORT),))]


def _reviews_pod(version: str) -> Obj:
    """reviews-VERSION's Pod; v2's runs a sidecar under its own service account."""
    address, labels = pod_address(f"r{version}"), {"version": version}
    if version != "v2":
        return pod(f"reviews-{version}", address, NAMESPACE, labels=labels)
    account = REVIEWS_V2.service_account
    return pod(
        REVIEWS_V2.pod_name,
        address,
        NAMESPACE,
        service_account=account,
        sidecar=True,
        labels=labels,
    )


def registry_objects() -> list[Obj]:
    """reviews (three pods, v2's with a sidecar), ratings (one pod, none) and productpage's
    own pod (a sidecar)."""
    reviews = {f"reviews-{v}": pod_address(f"r{v}") for v in VERSIONS}
    ratings = pod("ratings-v1", pod_address("ratings"), NAMESPACE, labels={"version": "v1"})
    productpage = pod(
        PRODUCTPAGE.pod_name,
        pod_address("product"),
        NAMESPACE,
        service_account=PRODUCTPAGE.service_account,
        sidecar=True,
        labels={"app": "productpage", "version": "v1"},
    )
    return [
        *_service("reviews", REVIEWS_IP, reviews),
        *(_reviews_pod(v) for v in VERSIONS),
        *_service("ratings", RATINGS_IP, {"ratings-v1": pod_address("ratings")}),
        ratings,
        productpage,
    ]


def istio_yaml(text: str) -> list[Obj]:
    """The objects of a YAML stream, as istio.io's pages give them (`kubectl apply -f`)."""
    objects = [o for o in yaml.safe_load_all(text) if o]
    for obj in objects:
        obj.setdefault("metadata", {}).setdefault("namespace", NAMESPACE)
    return objects


# istio.io: samples/bookinfo/networking/destination-rule-all.yaml, the rules of reviews and
# ratings (this mesh has neither productpage's Service nor details).
BOOKINFO_SUBSETS = """
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: reviews
spec:
  host: reviews
  subsets:
  - name: v1
    labels:
      version: v1
  - name: v2
    labels:
      version: v2
  - name: v3
    labels:
      version: v3
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: ratings
spec:
  host: ratings
  subsets:
  - name: v1
    labels:
      version: v1
  - name: v2
    labels:
      version: v2
  - name: v2-mysql
    labels:
      version: v2-mysql
  - name: v2-mysql-vm
    labels:
      version: v2-mysql-vm
"""


@dataclass
class Answer:
    """One request's answer as the app saw it, and how long it took (curl's time_total)."""

    status: int
    body: str
    seconds: float = 0.0


def _ending(line: str) -> tuple[int, float] | None:
    """The status and seconds of a transfer's `@@CODE TIME` line; None for a body's line."""
    code, _, seconds = line.removeprefix("@@").partition(" ")
    if not line.startswith("@@") or not code.isdigit():
        return None
    return int(code), float(seconds or 0)


def _parse_answers(out: str, count: int) -> list[Answer]:
    """curl's output of `count` transfers written as BODY, newline, @@CODE TIME, newline."""
    answers = []
    body = ""
    for line in out.split("\n"):
        if (ending := _ending(line)) is not None:
            answers.append(Answer(ending[0], body, ending[1]))
            body = ""
        else:
            body += line
    return answers + [Answer(0, "")] * (count - len(answers))


@dataclass
class Bookinfo:
    """Everything the traffic tests use, once it is all up."""

    network: PodNetwork
    folder: Path
    pilot: PilotProcess
    productpage: PodEnvoy
    reviews_v2: PodEnvoy  # reviews-v2's sidecar, through which it calls ratings
    backends: dict[str, PodProcess]  # version -> its backend
    ratings: PodProcess  # ratings-v1's backend
    _stacks: dict[str, AsyncExitStack] = field(default_factory=dict)

    def apply(self, *objects: Obj) -> None:
        """The registry file is now bookinfo and `objects`."""
        write_mesh(self.folder / "mesh.yaml", [*registry_objects(), *objects])

    async def restart_backend(self, version: str, *options: str) -> None:
        """reviews-VERSION's backend again, with http_backend's `options` (and its own)."""
        await self._stacks[version].aclose()
        self._stacks[version] = AsyncExitStack()
        self.backends[version] = await _reviews_backend(
            self._stacks[version], self.network[f"r{version}"], version, options
        )

    async def requests(self, count: int, headers: Sequence[str] = ()) -> list[Answer]:
        """`count` GETs of reviews from productpage's app, one after another."""
        argv = ["curl", "-sS", "--max-time", "5"]
        for header in headers:
            argv += ["-H", header]
        for _ in range(count):
            argv += ["-w", "\\n@@%{http_code} %{time_total}\\n", URL]
        _, out, _ = await self.network["product"].run(*argv, uid=APP_UID)
        return _parse_answers(out, count)

    async def versions(self, count: int, headers: Sequence[str] = ()) -> Counter[str]:
        """Which version answered each of `count` requests (a status other than 200: its
        status instead)."""
        answers = await self.requests(count, headers)
        return Counter(a.body if a.status == 200 else str(a.status) for a in answers)

    async def concurrent_statuses(self, count: int, parallel: int) -> Counter[int]:
        """`count` GETs, `parallel` at a time (curl --parallel): how many got each status."""
        argv = ["curl", "-sS", "--max-time", "10", "--parallel", "--parallel-immediate"]
        argv += ["--parallel-max", str(parallel), "-w", "%{http_code}\\n"]
        for _ in range(count):
            argv += ["-o", "/dev/null", URL]
        _, out, _ = await self.network["product"].run(*argv, uid=APP_UID)
        return Counter(int(code) for code in out.split())

    async def reviews_routes(self) -> list[Obj]:
        """The routes of reviews' virtual host in productpage's route configuration 9080."""
        return await routes_of(self.productpage, REVIEWS_HOST)

    async def wait_routes(
        self, what: str, until: Any, sidecar: PodEnvoy | None = None, host: str = REVIEWS_HOST
    ) -> list[Obj]:
        """Until `host`'s routes in `sidecar`'s Envoy (productpage's, reviews') satisfy
        `until`."""
        envoy = sidecar or self.productpage
        routes: list[Obj] = await wait_until(
            lambda: routes_of(envoy, host), CONVERGE_TIMEOUT,
            f"pod {envoy.pod.name}'s {host} routes: {what}",
            until=until, context=envoy.agent.tail,
        )  # fmt: skip
        return routes

    async def wait_subsets(self) -> None:
        """Until productpage's Envoy holds each subset cluster with its one pod."""
        for version in VERSIONS:
            expected = {(pod_address(f"r{version}"), PORT)}
            await self.productpage.wait_hosts(subset_cluster(version), expected, version)

    async def wait_ratings_v1(self) -> None:
        """Until reviews-v2's Envoy holds ratings' subset v1 with its one pod."""
        expected = {(pod_address("ratings"), PORT)}
        cluster = subset_cluster("v1", RATINGS_HOST)
        await self.reviews_v2.wait_hosts(cluster, expected, "ratings' v1")

    def productpage_node_id(self) -> str:
        """The node id productpage's agent gives its Envoy (Istio's sidecar~IP~POD.NS~...)."""
        pod_name, namespace = PRODUCTPAGE.pod_name, PRODUCTPAGE.namespace
        return (
            f"sidecar~{pod_address('product')}~{pod_name}.{namespace}~{namespace}.svc.cluster.local"
        )

    async def rejected(self) -> dict[str, int]:
        """Both Envoys' counts of xDS updates they rejected, by pod and stat (all should
        stay 0)."""
        counts: dict[str, int] = {}
        for sidecar in (self.productpage, self.reviews_v2):
            stats = await sidecar.stats(r"update_rejected$")
            counts |= {f"{sidecar.pod.name}: {name}": value for name, value in stats.items()}
        return counts

    def assert_nothing_restarted(self) -> None:
        assert self.pilot.alive, f"pilot exited; {self.pilot.tail()}"
        for sidecar in (self.productpage, self.reviews_v2):
            assert sidecar.agent.process.returncode is None, sidecar.agent.tail()
            assert envoy_pid(sidecar.agent) == sidecar.pid, "the agent restarted Envoy"


async def routes_of(sidecar: PodEnvoy, host: str) -> list[Obj]:
    """The routes of `host`'s virtual host in `sidecar`'s route configuration 9080."""
    dump = await sidecar.admin_json("/config_dump", resource="dynamic_route_configs")
    for entry in dump.get("configs", []):
        config = entry.get("route_config", {})
        for virtual in config.get("virtual_hosts", []) if config.get("name") == str(PORT) else []:
            if virtual.get("name") == f"{host}:{PORT}":
                return list(virtual.get("routes", []))
    return []


async def _pilot(stack: AsyncExitStack, pod_: Pod, folder: Path) -> PilotProcess:
    write_mesh(folder / "mesh.yaml", registry_objects())
    tokens = folder / "tokens.csv"
    accounts = ((TOKEN, PRODUCTPAGE), (REVIEWS_V2_TOKEN, REVIEWS_V2))
    tokens.write_text("".join(f"{token},system:serviceaccount:{NAMESPACE}:{w.service_account}\n"
                              for token, w in accounts))  # fmt: skip
    tokens.chmod(0o600)
    source = ["--config", str(folder / "mesh.yaml"), "--xds-auth", "kubernetes"]
    source += ["--token-auth-file", str(tokens)]
    return await start_pilot(stack, pod_, folder, source)


async def _backend(
    stack: AsyncExitStack, pod_: Pod, body: str, options: Iterable[str] = ()
) -> PodProcess:
    argv = [sys.executable, "-m", "tests.integration.http_backend", "--host", "0.0.0.0"]
    argv += ["--port", str(PORT), "--body", body, *options]
    return await stack.enter_async_context(
        running_in(pod_, argv, "serving on", uid=APP_UID, cwd=REPO)
    )


async def _reviews_backend(
    stack: AsyncExitStack, pod_: Pod, version: str, options: Iterable[str] = ()
) -> PodProcess:
    options = (*BACKEND_OPTIONS.get(version, ()), *options)
    return await _backend(stack, pod_, f"reviews-{version}", options)


async def _sidecar(
    stack: AsyncExitStack, pod_: Pod, workload: Workload, token: str, pilot: PilotProcess
) -> PodEnvoy:
    agent = await start_sidecar(stack, pod_, workload, pilot, token)
    return PodEnvoy(pod_, agent, envoy_pid(agent))


@asynccontextmanager
async def bookinfo_pods(folder: Path) -> AsyncIterator[Bookinfo]:
    """The whole mesh, up and synced; every process, namespace and rule gone afterwards."""
    hosts = {PILOT_HOST: pod_address("istiod")}
    for name, address in (("reviews", REVIEWS_IP), ("ratings", RATINGS_IP)):
        hosts |= {name: address, f"{name}.{NAMESPACE}.svc.cluster.local": address}
    async with pod_network(POD_NAMES, hosts=hosts) as network, AsyncExitStack() as stack:
        if shutil.which("curl") is None:
            pytest.fail("no curl, the pods' app and admin client (Debian: apt-get install curl)")
        pilot = await _pilot(stack, network["istiod"], folder)
        ratings = await _backend(stack, network["ratings"], "ratings-v1")
        stacks = {v: AsyncExitStack() for v in VERSIONS}
        backends = {v: await _reviews_backend(stacks[v], network[f"r{v}"], v) for v in VERSIONS}
        productpage = await _sidecar(stack, network["product"], PRODUCTPAGE, TOKEN, pilot)
        reviews_v2 = await _sidecar(stack, network["rv2"], REVIEWS_V2, REVIEWS_V2_TOKEN, pilot)
        running = Bookinfo(network, folder, pilot, productpage, reviews_v2, backends, ratings,
                           stacks)  # fmt: skip
        # restart_backend replaces a version's stack: close whichever is current.
        stack.push_async_callback(lambda: _close_all(running))
        await _synced(running)
        yield running
    assert leftovers(network) == [], "the pods' namespaces or links outlived the test"


async def _synced(running: Bookinfo) -> None:
    """Until productpage's Envoy holds reviews' pods and reviews-v2's holds ratings'."""
    expected = {(pod_address(f"r{v}"), PORT) for v in VERSIONS}
    cluster = f"outbound|{PORT}||{REVIEWS_HOST}"
    await running.productpage.wait_hosts(cluster, expected, "reviews")
    ratings = {(pod_address("ratings"), PORT)}
    cluster = f"outbound|{PORT}||{RATINGS_HOST}"
    await running.reviews_v2.wait_hosts(cluster, ratings, "ratings")


async def _close_all(running: Bookinfo) -> None:
    for version_stack in running._stacks.values():
        await version_stack.aclose()


def module_bookinfo(name: str) -> Any:
    """A module's `bookinfo` fixture: set up once (its folder named `name`), checked at
    the end for a sidecar that restarted."""

    @pytest_asyncio.fixture(scope="module", loop_scope="module")
    async def bookinfo(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bookinfo]:
        async with bookinfo_pods(tmp_path_factory.mktemp(name)) as running:
            yield running
            running.assert_nothing_restarted()

    return bookinfo
