"""deploy/example-app's sidecar on the real cluster: pilot's TLS port, root, projected token.

`kubectl apply -k deploy/example-app` on the real API server; the ReplicaSet
controller creates the echo Pods, the test kubelet runs them and the EndpointSlice
controller puts them behind Service echo. pilot runs as pilot's ServiceAccount with
`--xds-auth kubernetes` (the default) and `--namespaces example`, so that on a shared
cluster the mesh is the example's alone. The sidecar of one echo Pod runs as real
Envoy from the bootstrap the API server holds (tests.cluster.example_sidecar): it
trusts the root from ConfigMap istio-ca-root-cert, which pilot put in the namespace,
and presents the token the Pod's projected volume asks for (audience istio-ca, an hour,
bound to the Pod: TokenRequest as the kubelet calls it).

* With that token, Envoy gets the echo cluster with both Pods' endpoints and its
  `default` certificate for example/echo.
* With a token of another account, pilot refuses the stream (PERMISSION_DENIED, the
  claim and the proof named); with an empty token file, or a string TokenReview does
  not know, UNAUTHENTICATED. pilot sends nothing and mints nothing; Envoy holds no
  cluster from pilot and says why.

Tokens never appear in assertion messages: they are compared into booleans first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from tests.cluster.client import Kube, admin, path_of
from tests.cluster.control_plane import REPO, ControlPlane
from tests.cluster.discovery import counter, forget_shared_root, start_discovery
from tests.cluster.example_sidecar import (
    NAMESPACE,
    XDS_STAT_PREFIX,
    Sidecar,
    example_sidecar,
    expected_view,
)
from tests.cluster.kubelet import run_pod
from tests.cluster.root_configmaps import wait_published
from tests.cluster.workload_tokens import ISTIO_CA, service_account
from tests.support.ca import Token, write_plugged_in
from tests.support.envoy_process import EnvoyProcess, wait_until
from tests.support.envoy_view import ClusterView, dynamic_clusters, wait_for_view
from tests.support.mesh import cluster_name
from tests.support.pilot_process import PilotProcess

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

ECHO_IPS = ("10.244.38.7", "10.244.38.9")  # the echo Deployment's two Pods
PERMISSION_DENIED, UNAUTHENTICATED = 7, 16
MINTED = "pilot_sds_certs_minted"
SENT = "pilot_xds_pushes"


@dataclass
class Scene:
    plane: ControlPlane
    pilot: PilotProcess
    pod: dict[str, object]
    from_pilot: ClusterView
    folder: Path

    async def sidecar(self, kube: Kube, name: str) -> Sidecar:
        return await example_sidecar(kube, self.pod, self.folder / name, self.pilot.tls_port)

    def envoy(self, sidecar: Sidecar, name: str) -> EnvoyProcess:
        return EnvoyProcess(sidecar.bootstrap, self.folder / name / "envoy", "sidecar",
                            log_level="warning", extra_args=sidecar.node_args)  # fmt: skip


async def _run_echo_pods(kube: Kube) -> list[dict[str, object]]:
    """Both Pods of the echo Deployment, run by the test kubelet."""
    path = path_of("Pod", NAMESPACE) + "?labelSelector=app.kubernetes.io/name=echo"

    async def pods() -> list[dict[str, object]]:
        items: list[dict[str, object]] = (await kube.get(path))["items"]
        return items

    created = await wait_until(pods, 30, "the echo Deployment's two Pods",
                               until=lambda found: len(found) == len(ECHO_IPS))  # fmt: skip
    return [await run_pod(kube, pod, ip) for pod, ip in zip(created, ECHO_IPS, strict=True)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scene(
    deployed: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Scene]:
    folder = tmp_path_factory.mktemp("example-sidecar")
    ca = write_plugged_in(folder / "ca")
    deployed.kubectl("apply", "-k", str(REPO / "deploy" / "example-app"))
    try:
        async with admin(deployed) as kube:
            pods = await _run_echo_pods(kube)
            await forget_shared_root(kube)  # the Lease free: pilot writes the root at once
            pilot = await start_discovery(
                kube, deployed, folder / "pilot", "--namespaces", NAMESPACE, ca=ca
            )
            await wait_published(kube, [NAMESPACE], pilot.root_pem)
        port = 8443  # Service echo's
        echo = {(str(p["status"]["podIP"]), port): "HEALTHY" for p in pods}  # type: ignore[index]
        try:
            yield Scene(deployed, pilot, pods[0],
                        {cluster_name("echo", port, NAMESPACE): echo}, folder)  # fmt: skip
        finally:
            await pilot.stop()
    finally:
        deployed.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


async def _certificate_uris(envoy: EnvoyProcess) -> list[str]:
    certificates = (await envoy.certs()).get("certificates", [])
    chains = [cert for entry in certificates for cert in entry.get("cert_chain", [])]
    return [san["uri"] for cert in chains for san in cert.get("subject_alt_names", [])]


async def test_the_sidecar_gets_the_mesh_with_its_projected_token(scene: Scene) -> None:
    async with admin(scene.plane) as kube:
        sidecar = await scene.sidecar(kube, "served")
        sidecar.write_token(await sidecar.projected_token(kube))
    namespace, account = sidecar.claimed
    uri = f"spiffe://cluster.local/ns/{namespace}/sa/{account}"
    minted, sent = await counter(scene.pilot, MINTED), await counter(scene.pilot, SENT)
    async with scene.envoy(sidecar, "served") as envoy:
        expected = expected_view(sidecar.bootstrap, scene.from_pilot)
        await wait_for_view(envoy, expected, "the mesh, over the TLS port with the token")
        await envoy.wait_for(
            lambda: _certificate_uris(envoy), 10, f"the `default` certificate for {uri}",
            until=lambda uris: uri in uris,
        )  # fmt: skip
        assert await envoy.stat("control_plane.connected_state") == 1
    # What the refusals below must leave unchanged, seen changing here.
    assert await counter(scene.pilot, SENT) > sent
    assert await counter(scene.pilot, MINTED) == minted + 1


@dataclass(frozen=True)
class Refusal:
    code: int
    pilot_says: str  # part of pilot's warning, and of the status Envoy logs
    account: str | None = None  # the token: this account's (in the Pod's namespace)...
    text: str = ""  # ...or else the token file holds this


REFUSALS = {
    "other-account": Refusal(
        PERMISSION_DENIED,
        f"node metadata claims {NAMESPACE}/echo but the credentials are {NAMESPACE}/intruder",
        account="intruder",
    ),
    "empty-token-file": Refusal(UNAUTHENTICATED, "xDS streams must carry a service-account token"),
    "not-issued": Refusal(
        UNAUTHENTICATED, "token rejected: invalid bearer token", text="not-a-token"
    ),
}


async def _token(kube: Kube, refusal: Refusal) -> str:
    if refusal.account is None:
        return refusal.text
    status, _ = await kube.request("GET", path_of("ServiceAccount", NAMESPACE, refusal.account))
    if status == 404:
        await kube.create(service_account(NAMESPACE, refusal.account))
    return Token(await kube.token(NAMESPACE, refusal.account, [ISTIO_CA], 3600))


@pytest.mark.parametrize("case", list(REFUSALS))
async def test_the_sidecar_is_refused_without_its_own_token(scene: Scene, case: str) -> None:
    refusal = REFUSALS[case]
    async with admin(scene.plane) as kube:
        sidecar = await scene.sidecar(kube, case)
        token = await _token(kube, refusal)
    sidecar.write_token(token)
    pilot = scene.pilot
    minted, sent, mark = await counter(pilot, MINTED), await counter(pilot, SENT), pilot.mark()

    def refusals() -> int:
        return len(pilot.logged(
            lambda e: "refused" in e["msg"] and refusal.pilot_says in e["msg"], mark
        ))  # fmt: skip

    async with scene.envoy(sidecar, case) as envoy:
        # Twice: the first stream is refused, and so is Envoy's retry.
        await envoy.wait_for(refusals, 15, "pilot to refuse twice", until=lambda n: n >= 2)
        closed = f"grpc.{XDS_STAT_PREFIX}.streams_closed_{refusal.code}"
        await envoy.wait_for_stat(closed, lambda n: isinstance(n, int) and n >= 2)
        assert await envoy.stat("control_plane.connected_state") == 0
        assert await envoy.dynamic_active_clusters() == {}
        static = sidecar.bootstrap["static_resources"]["clusters"]
        view = await dynamic_clusters(envoy)
        assert view.keys() == {c["name"] for c in static}, "no cluster from pilot"
        eds = [c["name"] for c in static if c["type"] == "EDS"]
        assert eds, "the example has a cluster whose endpoints come from pilot"
        assert all(view[name] == {} for name in eds), f"endpoints from pilot: {view}"
        log = envoy.log_path.read_text()
        said = f"gRPC config stream to 127.0.0.1:{pilot.tls_port} closed:"
        assert f"{said} {refusal.code}, {refusal.pilot_says}" in log, envoy.log_tail()

    assert await counter(pilot, SENT) == sent, "pilot sent nothing"
    assert await counter(pilot, MINTED) == minted, "and minted nothing"
    leaked = bool(token) and any(token in e["msg"] for e in pilot.log[mark:])
    assert not leaked, "pilot logged the token"
