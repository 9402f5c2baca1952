"""Bookinfo's reviews in pods (tests/support/pods), for istio.io's traffic tasks, set up once.

The pods, each a network namespace on one bridge (198.18.0.0/15 only):

- `istiod` (198.18.0.2): `pilot discovery --config mesh.yaml` (the registry file,
  rewritten by each test, reloaded on change), its TLS xDS port 15012 on the pod's
  address, the agent's token proven by `--token-auth-file`;
- `product`, productpage's pod (198.18.0.3, namespace `default`): capture rules and `pilot agent`
  starting Envoy as uid 1337; the app is the curl a test runs there as uid 1000;
- `rv1`, `rv2`, `rv3` (.4, .5, .6): pods of the Service `reviews` (9080,
  labels `version: v1` ...) with no sidecar, each running the recording backend
  (tests/integration/http_backend) that answers with its version (`reviews-v2`);
  a test may restart one to fail or slow down.

Names resolve by hosts entries (reviews -> its ClusterIP), so the app dials
`reviews:9080`, as productpage does in bookinfo; nothing routes the ClusterIP but
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
VERSIONS = ("v1", "v2", "v3")
# Short: a pod's name ends its links' names, cut at 15 characters.
POD_NAMES = ("istiod", "product", "rv1", "rv2", "rv3")
PRODUCTPAGE = Workload(NAMESPACE, "bookinfo-productpage", "productpage-v1-7d6cf-a1a1a")
TOKEN = "productpage-token-for-the-registry-file-mesh"
REVIEWS_HOST = f"reviews.{NAMESPACE}.svc.cluster.local"
URL = f"http://reviews:{PORT}/reviews/0"


def pod_address(name: str) -> str:
    return f"198.18.0.{POD_NAMES.index(name) + 2}"


def subset_cluster(version: str) -> str:
    return f"outbound|{PORT}|{version}|{REVIEWS_HOST}"


def registry_objects() -> list[Obj]:
    """reviews (three pods, no sidecar) and productpage's own pod (a sidecar)."""
    reviews = service("reviews", NAMESPACE, (("http", PORT),))
    reviews["spec"]["clusterIP"] = REVIEWS_IP
    pods = [
        pod(f"reviews-{v}", pod_address(f"r{v}"), NAMESPACE, labels={"version": v})
        for v in VERSIONS
    ]
    endpoints = [Ep(pod_address(f"r{v}"), pod=f"reviews-{v}") for v in VERSIONS]
    productpage = pod(
        PRODUCTPAGE.pod_name,
        pod_address("product"),
        NAMESPACE,
        service_account=PRODUCTPAGE.service_account,
        sidecar=True,
        labels={"app": "productpage", "version": "v1"},
    )
    return [
        reviews,
        endpoint_slice("reviews", endpoints, NAMESPACE, (("http", PORT),)),
        *pods,
        productpage,
    ]


def istio_yaml(text: str) -> list[Obj]:
    """The objects of a YAML stream, as istio.io's pages give them (`kubectl apply -f`)."""
    objects = [o for o in yaml.safe_load_all(text) if o]
    for obj in objects:
        obj.setdefault("metadata", {}).setdefault("namespace", NAMESPACE)
    return objects


# istio.io: samples/bookinfo/networking/destination-rule-all.yaml, reviews' rule.
REVIEWS_SUBSETS = """
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
"""


@dataclass
class Answer:
    """One request's answer as the app saw it."""

    status: int
    body: str


def _parse_answers(out: str, count: int) -> list[Answer]:
    """curl's output of `count` transfers written as BODY, newline, @@CODE, newline."""
    answers = []
    body = ""
    for line in out.split("\n"):
        if line.startswith("@@") and line[2:].isdigit():
            answers.append(Answer(int(line[2:]), body))
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
    backends: dict[str, PodProcess]  # version -> its backend
    _stacks: dict[str, AsyncExitStack] = field(default_factory=dict)

    def apply(self, *objects: Obj) -> None:
        """The registry file is now bookinfo and `objects`."""
        write_mesh(self.folder / "mesh.yaml", [*registry_objects(), *objects])

    async def restart_backend(self, version: str, *options: str) -> None:
        """reviews-VERSION's backend again, with http_backend's `options`."""
        await self._stacks[version].aclose()
        self._stacks[version] = AsyncExitStack()
        self.backends[version] = await _backend(
            self._stacks[version], self.network[f"r{version}"], version, options
        )

    async def requests(self, count: int, headers: Sequence[str] = ()) -> list[Answer]:
        """`count` GETs of reviews from productpage's app, one after another."""
        argv = ["curl", "-sS", "--max-time", "5"]
        for header in headers:
            argv += ["-H", header]
        for _ in range(count):
            argv += ["-w", "\\n@@%{http_code}\\n", URL]
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
        dump = await self.productpage.admin_json("/config_dump", resource="dynamic_route_configs")
        for entry in dump.get("configs", []):
            config = entry.get("route_config", {})
            for host in config.get("virtual_hosts", []) if config.get("name") == str(PORT) else []:
                if host.get("name") == f"{REVIEWS_HOST}:{PORT}":
                    return list(host.get("routes", []))
        return []

    async def wait_routes(self, what: str, until: Any) -> list[Obj]:
        """Until reviews' routes in productpage's Envoy satisfy `until`."""
        routes: list[Obj] = await wait_until(
            self.reviews_routes, CONVERGE_TIMEOUT, f"productpage's reviews routes: {what}",
            until=until, context=self.productpage.agent.tail,
        )  # fmt: skip
        return routes

    async def wait_subsets(self) -> None:
        """Until productpage's Envoy holds each subset cluster with its one pod."""
        for version in VERSIONS:
            expected = {(pod_address(f"r{version}"), PORT)}
            await self.productpage.wait_hosts(subset_cluster(version), expected, version)

    def productpage_node_id(self) -> str:
        """The node id productpage's agent gives its Envoy (Istio's sidecar~IP~POD.NS~...)."""
        pod_name, namespace = PRODUCTPAGE.pod_name, PRODUCTPAGE.namespace
        return (
            f"sidecar~{pod_address('product')}~{pod_name}.{namespace}~{namespace}.svc.cluster.local"
        )

    async def rejected(self) -> dict[str, int]:
        """Envoy's counts of xDS updates it rejected, by stat (all should stay 0)."""
        return await self.productpage.stats(r"update_rejected$")

    def assert_nothing_restarted(self) -> None:
        assert self.pilot.alive, f"pilot exited; {self.pilot.tail()}"
        sidecar = self.productpage
        assert sidecar.agent.process.returncode is None, sidecar.agent.tail()
        assert envoy_pid(sidecar.agent) == sidecar.pid, "the agent restarted Envoy"


async def _pilot(stack: AsyncExitStack, pod_: Pod, folder: Path) -> PilotProcess:
    write_mesh(folder / "mesh.yaml", registry_objects())
    tokens = folder / "tokens.csv"
    tokens.write_text(f"{TOKEN},system:serviceaccount:{NAMESPACE}:{PRODUCTPAGE.service_account}\n")
    tokens.chmod(0o600)
    source = ["--config", str(folder / "mesh.yaml"), "--xds-auth", "kubernetes"]
    source += ["--token-auth-file", str(tokens)]
    return await start_pilot(stack, pod_, folder, source)


async def _backend(
    stack: AsyncExitStack, pod_: Pod, version: str, options: Iterable[str] = ()
) -> PodProcess:
    argv = [sys.executable, "-m", "tests.integration.http_backend", "--host", "0.0.0.0"]
    argv += ["--port", str(PORT), "--body", f"reviews-{version}", *options]
    return await stack.enter_async_context(
        running_in(pod_, argv, "serving on", uid=APP_UID, cwd=REPO)
    )


async def _sidecar(stack: AsyncExitStack, pod_: Pod, pilot: PilotProcess) -> PodEnvoy:
    agent = await start_sidecar(stack, pod_, PRODUCTPAGE, pilot, TOKEN)
    return PodEnvoy(pod_, agent, envoy_pid(agent))


@asynccontextmanager
async def bookinfo_pods(folder: Path) -> AsyncIterator[Bookinfo]:
    """The whole mesh, up and synced; every process, namespace and rule gone afterwards."""
    hosts = {PILOT_HOST: pod_address("istiod"), "reviews": REVIEWS_IP, REVIEWS_HOST: REVIEWS_IP}
    async with pod_network(POD_NAMES, hosts=hosts) as network, AsyncExitStack() as stack:
        if shutil.which("curl") is None:
            pytest.fail("no curl, the pods' app and admin client (Debian: apt-get install curl)")
        pilot = await _pilot(stack, network["istiod"], folder)
        stacks = {v: AsyncExitStack() for v in VERSIONS}
        backends = {v: await _backend(stacks[v], network[f"r{v}"], v) for v in VERSIONS}
        productpage = await _sidecar(stack, network["product"], pilot)
        running = Bookinfo(network, folder, pilot, productpage, backends, stacks)
        # restart_backend replaces a version's stack: close whichever is current.
        stack.push_async_callback(lambda: _close_all(running))
        expected = {(pod_address(f"r{v}"), PORT) for v in VERSIONS}
        await productpage.wait_hosts(f"outbound|{PORT}||{REVIEWS_HOST}", expected, "reviews")
        yield running
    assert leftovers(network) == [], "the pods' namespaces or links outlived the test"


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
