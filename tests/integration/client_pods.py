"""Reviews and three client pods in two namespaces (tests/support/pods), for routes and
clusters that depend on the client, set up once.

The pods, each a network namespace on one bridge (198.18.0.0/15 only):

- `istiod` (198.18.0.2): `pilot discovery --config mesh.yaml` (the registry file,
  rewritten by each test, reloaded on change), its TLS xDS port 15012 on the pod's
  address, each agent's token proven by `--token-auth-file`;
- three clients with capture rules and `pilot agent` starting Envoy as uid 1337, the
  app the curl a test runs there as uid 1000: `web` (namespace `default`, labels
  `app: web`), `tester` (`default`, `app: tester`) and `front` (namespace `front`,
  `app: front`), each under a service account of its name, each with its Pod in the
  registry;
- `rv1`, `rv2`, `rv3`: the pods of Service `reviews` (namespace `default`, 9080, labels
  `version: v1` ...) with no sidecar, each answering with its version (`reviews-v2`).

Names resolve by hosts entries (reviews, its FQDN -> its ClusterIP). The Istio objects
the tests write (`SUBSETS`, bookinfo's public rule for reviews) and what they assert of the
answers (`only` one version, a `spread` over several, `nothing_rejected`) are here too.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.integration.agent_process import PILOT, REPO
from tests.integration.mesh_pods import PodEnvoy
from tests.integration.pod_control_plane import PILOT_HOST, start_pilot, start_sidecar
from tests.integration.sidecar_support import Workload, envoy_pid
from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, endpoint_slice, istio_object, pod, service, write_mesh
from tests.support.pilot_process import PilotProcess
from tests.support.pod_process import running_in
from tests.support.pods import Pod, PodNetwork, leftovers, pod_network

Obj = dict[str, Any]

PORT = 9080
APP_UID = 1000
CONVERGE_TIMEOUT = 20.0
REVIEWS_IP = "198.19.0.10"
VERSIONS = ("v1", "v2", "v3")
POD_NAMES = ("istiod", "web", "tester", "front", "rv1", "rv2", "rv3")
# client pod -> (namespace, its labels)
CLIENTS = {
    "web": ("default", {"app": "web"}),
    "tester": ("default", {"app": "tester"}),
    "front": ("front", {"app": "front"}),
}
REVIEWS_HOST = "reviews.default.svc.cluster.local"
URL = f"http://{REVIEWS_HOST}:{PORT}/reviews/0"
REQUESTS = 12  # the GETs `only` and `spread` send


def pod_address(name: str) -> str:
    return f"198.18.0.{POD_NAMES.index(name) + 2}"


def workload(client: str) -> Workload:
    return Workload(CLIENTS[client][0], client, f"{client}-7d6cf-a1a1a")


def token(client: str) -> str:
    return f"{client}-token-for-the-client-routes-mesh"


def registry_objects(labels: dict[str, dict[str, str]] | None = None) -> list[Obj]:
    """reviews (three pods, no sidecar) and each client's own pod (a sidecar), a pod's
    labels replaced by `labels[pod]` where given (a client's all of them, a reviews pod's
    `version`: `labels["rv3"] = {"version": "v2"}`)."""
    reviews = service("reviews", "default", (("http", PORT),))
    reviews["spec"]["clusterIP"] = REVIEWS_IP
    pods = [
        pod(
            f"reviews-{v}",
            pod_address(f"r{v}"),
            "default",
            labels=(labels or {}).get(f"r{v}", {"version": v}),
        )
        for v in VERSIONS
    ]
    endpoints = [Ep(pod_address(f"r{v}"), pod=f"reviews-{v}") for v in VERSIONS]
    clients = []
    for name, (namespace, own) in CLIENTS.items():
        client = pod(
            workload(name).pod_name,
            pod_address(name),
            namespace,
            service_account=name,
            sidecar=True,
        )
        client["metadata"]["labels"] = {**(labels or {}).get(name, own)}
        clients.append(client)
    return [
        reviews,
        endpoint_slice("reviews", endpoints, "default", (("http", PORT),)),
        *pods,
        *clients,
    ]


@dataclass
class ClientMesh:
    """Everything the tests use, once it is all up."""

    network: PodNetwork
    folder: Path
    pilot: PilotProcess
    sidecars: dict[str, PodEnvoy]

    def apply(self, *objects: Obj, labels: dict[str, dict[str, str]] | None = None) -> None:
        """The registry file is now the mesh (pods relabelled by `labels`) and `objects`."""
        write_mesh(self.folder / "mesh.yaml", [*registry_objects(labels), *objects])

    async def versions(self, client: str, count: int) -> Counter[str]:
        """Which version answered each of `count` GETs of reviews from `client`'s app (a
        status other than 200: its status instead)."""
        argv = ["curl", "-sS", "--max-time", "5"]
        for _ in range(count):
            argv += ["-w", "\\n@@%{http_code}\\n", URL]
        _, out, _ = await self.network[client].run(*argv, uid=APP_UID)
        found: Counter[str] = Counter()
        body = ""
        for line in out.split("\n"):
            if line.startswith("@@") and line[2:].isdigit():
                found[body if line[2:] == "200" else line[2:]] += 1
                body = ""
            else:
                body += line
        return found

    async def reviews_routes(self, client: str) -> list[Obj]:
        """The routes of reviews' virtual host in `client`'s route configuration 9080."""
        envoy = self.sidecars[client]
        dump = await envoy.admin_json("/config_dump", resource="dynamic_route_configs")
        for entry in dump.get("configs", []):
            config = entry.get("route_config", {})
            for host in config.get("virtual_hosts", []) if config.get("name") == str(PORT) else []:
                if host.get("name") == f"{REVIEWS_HOST}:{PORT}":
                    return list(host.get("routes", []))
        return []

    async def wait_clusters(self, client: str, clusters: list[str]) -> None:
        """Until `client`'s reviews routes send to `clusters` (subset names, "" for the
        service's cluster), route by route."""

        async def sent_to() -> list[str]:
            return [
                r.get("route", {}).get("cluster", "") for r in await self.reviews_routes(client)
            ]

        expected = [f"outbound|{PORT}|{s}|{REVIEWS_HOST}" for s in clusters]
        await wait_until(
            sent_to, CONVERGE_TIMEOUT, f"{client}'s reviews routes to {clusters}",
            until=lambda found: found == expected, context=self.sidecars[client].agent.tail,
        )  # fmt: skip

    async def proxy_config_routes(self, client: str) -> list[Obj]:
        """`pilot proxy-config routes` of `client`'s sidecar, as JSON, run beside pilot as
        an operator would, with that client's token."""
        token_file = self.folder / f"{client}-token"
        token_file.write_text(token(client))
        token_file.chmod(0o600)
        own = workload(client)
        node_id = f"sidecar~{pod_address(client)}~{own.pod_name}.{own.namespace}~"
        node_id += f"{own.namespace}.svc.cluster.local"
        status, out, err = await self.network["istiod"].run(
            str(PILOT), "proxy-config", "routes", node_id,
            "--addr", f"127.0.0.1:{self.pilot.grpc_port}", "--token-file", str(token_file),
            "-o", "json",
        )  # fmt: skip
        assert status == 0, err
        rows: list[Obj] = json.loads(out)
        return rows

    async def rejected(self) -> dict[str, int]:
        """Every client Envoy's count of xDS updates it rejected (all should stay 0)."""
        found: dict[str, int] = {}
        for name, envoy in self.sidecars.items():
            found |= {
                f"{name}: {k}": v for k, v in (await envoy.stats(r"update_rejected$")).items()
            }
        return found


# ------------------------------------------------------------------ Istio objects, answers


def virtual_service(name: str, namespace: str, spec: Obj) -> Obj:
    return istio_object("VirtualService", name, namespace, spec)


def destination_rule(name: str, namespace: str, spec: Obj) -> Obj:
    return istio_object("DestinationRule", name, namespace, spec)


def subsets(*versions: str) -> list[Obj]:
    """A DestinationRule's subsets, one per version, each the pods labelled with it."""
    return [{"name": v, "labels": {"version": v}} for v in versions]


# The public rule of istio.io's bookinfo samples: reviews' subsets v1, v2 and v3.
SUBSETS = destination_rule("reviews", "default", {"host": "reviews", "subsets": subsets(*VERSIONS)})


def to(subset: str, host: str = "reviews") -> Obj:
    return {"destination": {"host": host, "subset": subset}}


async def nothing_rejected(mesh: ClientMesh) -> None:
    counts = await mesh.rejected()
    assert counts, "no rejection counters read"
    assert {k: v for k, v in counts.items() if v} == {}


async def only(mesh: ClientMesh, client: str, version: str) -> None:
    assert await mesh.versions(client, REQUESTS) == {f"reviews-{version}": REQUESTS}


async def spread(mesh: ClientMesh, client: str) -> None:
    """The default route: round robin over every pod, so more than one version answers."""
    answers = await mesh.versions(client, REQUESTS)
    assert sum(answers.values()) == REQUESTS and len(answers) > 1, answers
    assert set(answers) <= {"reviews-v1", "reviews-v2", "reviews-v3"}, answers


async def _pilot(stack: AsyncExitStack, pod_: Pod, folder: Path) -> PilotProcess:
    write_mesh(folder / "mesh.yaml", registry_objects())
    tokens = folder / "tokens.csv"
    lines = [f"{token(c)},system:serviceaccount:{ns}:{c}\n" for c, (ns, _) in CLIENTS.items()]
    tokens.write_text("".join(lines))
    tokens.chmod(0o600)
    source = ["--config", str(folder / "mesh.yaml"), "--xds-auth", "kubernetes"]
    source += ["--token-auth-file", str(tokens)]
    return await start_pilot(stack, pod_, folder, source)


async def _backend(stack: AsyncExitStack, pod_: Pod, version: str) -> None:
    argv = [sys.executable, "-m", "tests.integration.http_backend", "--host", "0.0.0.0"]
    argv += ["--port", str(PORT), "--body", f"reviews-{version}"]
    await stack.enter_async_context(running_in(pod_, argv, "serving on", uid=APP_UID, cwd=REPO))


async def _sidecar(stack: AsyncExitStack, pod_: Pod, pilot: PilotProcess, client: str) -> PodEnvoy:
    agent = await start_sidecar(stack, pod_, workload(client), pilot, token(client))
    return PodEnvoy(pod_, agent, envoy_pid(agent))


@asynccontextmanager
async def client_pods(folder: Path) -> AsyncIterator[ClientMesh]:
    """The whole mesh, up and synced; every process, namespace and rule gone afterwards."""
    hosts = {PILOT_HOST: pod_address("istiod"), "reviews": REVIEWS_IP, REVIEWS_HOST: REVIEWS_IP}
    async with pod_network(POD_NAMES, hosts=hosts) as network, AsyncExitStack() as stack:
        if shutil.which("curl") is None:
            pytest.fail("no curl, the pods' app and admin client (Debian: apt-get install curl)")
        pilot = await _pilot(stack, network["istiod"], folder)
        for version in VERSIONS:
            await _backend(stack, network[f"r{version}"], version)
        sidecars = {c: await _sidecar(stack, network[c], pilot, c) for c in CLIENTS}
        expected = {(pod_address(f"r{v}"), PORT) for v in VERSIONS}
        for envoy in sidecars.values():
            await envoy.wait_hosts(f"outbound|{PORT}||{REVIEWS_HOST}", expected, "reviews")
        yield ClientMesh(network, folder, pilot, sidecars)
    assert leftovers(network) == [], "the pods' namespaces or links outlived the test"


def module_client_pods(name: str) -> Any:
    """A module's `mesh` fixture: set up once (its folder named `name`)."""

    @pytest_asyncio.fixture(scope="module", loop_scope="module")
    async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ClientMesh]:
        async with client_pods(tmp_path_factory.mktemp(name)) as running:
            yield running

    return mesh
