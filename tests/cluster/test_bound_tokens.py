"""Service-account tokens from the real API server, at pilot's CA and on its xDS port.

`pilot discovery --kubeconfig` runs as pilot's own ServiceAccount (deploy/'s RBAC
allows it TokenReviews), with `--xds-auth kubernetes` (the default there) and a
plugged-in CA written here. A workload Pod, run by the test kubelet under a
ServiceAccount of its own, gets its tokens as the kubelet asks for them: TokenRequest,
bound to the Pod. Whether a token is good is the real TokenReview's verdict alone:

* audience `istio-ca`: pilot's CA signs a CSR for the token's identity (the chain
  leads to the root), and an xDS stream over TLS gets the mesh and its `default`
  certificate for that identity, with or without node metadata naming the account;
* refused with UNAUTHENTICATED by the CA and on xDS alike, TokenReview's reason in
  the status, nothing signed or minted, the token never repeated: audience `other`;
  a token bound to a Pod deleted since; a string nobody issued; an expired token.
* `--token-audience mesh-ca`: the audience pilot asks TokenReview for, so a token
  for `mesh-ca` is signed for and one for `istio-ca` is not.

TokenRequest issues nothing shorter than 600 s (it answers 422), so expiry cannot be
waited out: the expired token is a real one of the Pod with its times moved an hour
back, signed again with the cluster's service-account key; the same token signed
again unchanged is accepted, so its age alone is what TokenReview refuses.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from tests.cluster.client import Kube, admin
from tests.cluster.control_plane import ControlPlane
from tests.cluster.discovery import counter, start_discovery
from tests.cluster.kubelet import remove_pod
from tests.cluster.workload_tokens import Workload, run_workload, signed_again
from tests.support.ca import (
    PluggedIn,
    Token,
    assert_issued_chain,
    load_chain,
    write_plugged_in,
)
from tests.support.mesh import cluster_name
from tests.support.mint_client import mint
from tests.support.pilot_process import PilotProcess
from tests.support.sds_secrets import ROOT, WORKLOAD
from tests.support.xds_client import (
    ADS_SOTW,
    CLUSTER,
    SECRET,
    Closed,
    describe,
    fingerprint,
    first_reply,
    node,
    summarize_secret,
    tls_credentials,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT = 10.0
HOUR = 3600
SIGNED = "citadel_server_success_cert_issuance_count"
MINTED = "pilot_sds_certs_minted"


@dataclass
class Scene:
    """The control plane, pilot, its CA, and the running workload."""

    plane: ControlPlane
    pilot: PilotProcess
    ca: PluggedIn
    workload: Workload
    folder: Path

    @property
    def mesh_cluster(self) -> str:
        """The cluster of the workload's own Service."""
        return cluster_name("web", 80, self.workload.namespace)

    def node(self, claims: bool = True) -> base_pb2.Node:
        """The workload's sidecar node; with NAMESPACE and SERVICE_ACCOUNT if `claims`."""
        w = self.workload
        node_id = f"sidecar~{w.ip}~{w.name}.{w.namespace}~{w.namespace}.svc.cluster.local"
        metadata = {"NAMESPACE": w.namespace, "SERVICE_ACCOUNT": w.account} if claims else {}
        return node(node_id, metadata)


def _service(namespace: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80,
                                                         "targetPort": 8080}]},
    }  # fmt: skip


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scene(
    deployed: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Scene]:
    folder = tmp_path_factory.mktemp("bound-tokens")
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    deployed.kubectl("create", "namespace", namespace)
    ca = write_plugged_in(folder / "ca")
    try:
        async with admin(deployed) as kube:
            await kube.create(_service(namespace))
            workload = await run_workload(kube, namespace, "web", "10.244.36.10")
            pilot = await start_discovery(kube, deployed, folder / "pilot", ca=ca)
        try:
            yield Scene(deployed, pilot, ca, workload, folder)
        finally:
            await pilot.stop()
    finally:
        deployed.kubectl("delete", "namespace", namespace, "--wait=false")


# ------------------------------------------------------------------ asking


def _out(scene: Scene) -> Path:
    """A new folder for what one CreateCertificate call writes."""
    out = scene.folder / f"csr-{uuid.uuid4().hex[:8]}"
    out.mkdir()
    return out


async def _certificate(scene: Scene, pilot: PilotProcess, token: str) -> str:
    """CreateCertificate over TLS with `token`, as a node agent: the leaf's URI; the chain
    must lead to the plugged-in root."""
    out = _out(scene)
    uri = await mint(pilot.target(tls=True), pilot.root_pem, token, out)
    assert_issued_chain(load_chain((out / "cert.pem").read_bytes()), scene.ca.root.cert)
    return uri


async def _ca_refusal(scene: Scene, token: str) -> tuple[grpc.StatusCode, str]:
    """How CreateCertificate with `token` is refused (fails if it is signed)."""
    try:
        uri = await mint(scene.pilot.target(tls=True), scene.pilot.root_pem, token, _out(scene))
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    pytest.fail(f"the CA signed a certificate for {uri}")


async def _xds_refusal(scene: Scene, token: str) -> tuple[grpc.StatusCode, str]:
    """How an ADS stream over TLS asking for its certificates with `token` ends."""
    request = discovery_pb2.DiscoveryRequest(
        node=scene.node(), type_url=SECRET, resource_names=[WORKLOAD, ROOT]
    )
    credentials = tls_credentials(scene.pilot.root_pem)
    target = scene.pilot.target(tls=True)
    reply = await first_reply(target, ADS_SOTW, [request], credentials=credentials, token=token)
    if not isinstance(reply, Closed):
        pytest.fail(f"the stream was served ({describe(reply)}) instead of refused")
    return reply.code, reply.details


# ------------------------------------------------------------------ accepted


@pytest.mark.parametrize("claims", [True, False], ids=["metadata-names-it", "no-metadata"])
async def test_a_token_bound_to_the_pod_for_istio_ca_gets_certificates_and_the_mesh(
    scene: Scene, claims: bool
) -> None:
    async with admin(scene.plane) as kube:
        token = await scene.workload.token(kube)
    signed, minted = await counter(scene.pilot, SIGNED), await counter(scene.pilot, MINTED)
    uri = await _certificate(scene, scene.pilot, token)
    assert uri == scene.workload.spiffe, "the CA signs for the token's identity"

    async with scene.pilot.client(tls=True, token=token) as xds:
        ads = xds.ads(scene.node(claims))
        await ads.subscribe(CLUSTER)
        await ads.ack_until(CLUSTER, [scene.mesh_cluster], WAIT)
        await ads.subscribe(SECRET, [WORKLOAD, ROOT])
        secrets = await ads.ack_until(SECRET, [WORKLOAD, ROOT], WAIT)
    workload, root = summarize_secret(secrets[WORKLOAD]), summarize_secret(secrets[ROOT])
    assert workload.uris == (scene.workload.spiffe,), "the stream speaks for its token"
    assert workload.key_matches_leaf
    assert root.trusted_ca_sha256 == (fingerprint(scene.ca.root.cert_pem.encode()),)
    # What a refusal must leave unchanged, seen changing here.
    assert await counter(scene.pilot, SIGNED) == signed + 1
    assert await counter(scene.pilot, MINTED) == minted + 1


# ------------------------------------------------------------------ refused

TokenMaker = Callable[[Kube, Scene], Awaitable[Token]]


async def _other_audience(kube: Kube, scene: Scene) -> Token:
    return await scene.workload.token(kube, audience="other")


async def _of_a_deleted_pod(kube: Kube, scene: Scene) -> Token:
    """A token bound to a Pod of the same account, then the Pod deleted."""
    gone = await run_workload(kube, scene.workload.namespace, "gone", "10.244.36.11")
    token = await gone.token(kube)
    await remove_pod(kube, gone.pod)
    return token


async def _not_issued(kube: Kube, scene: Scene) -> Token:
    return Token("not-a-token-anyone-issued")


async def _expired(kube: Kube, scene: Scene) -> Token:
    token = await scene.workload.token(kube)
    return signed_again(token, scene.plane.pki.sa_key, shift=-HOUR)


REFUSED: dict[str, tuple[TokenMaker, str]] = {
    "audience-other": (
        _other_audience,
        'token audiences ["other"] is invalid for the target audiences ["istio-ca"]',
    ),
    "pod-deleted": (_of_a_deleted_pod, "service account token has been invalidated"),
    "not-issued": (_not_issued, "invalid bearer token"),
    "expired": (_expired, "service account token has expired"),
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_a_token_tokenreview_rejects_gets_nothing(scene: Scene, case: str) -> None:
    make, reason = REFUSED[case]
    async with admin(scene.plane) as kube:
        token = await make(kube, scene)
    signed, minted = await counter(scene.pilot, SIGNED), await counter(scene.pilot, MINTED)

    for where, refusal in (("CA", _ca_refusal), ("xDS", _xds_refusal)):
        code, details = await refusal(scene, token)
        assert code == grpc.StatusCode.UNAUTHENTICATED, f"{where}: {code.name} {details}"
        assert "token rejected" in details and reason in details, f"{where}: {details}"
        assert token not in details, f"{where}'s refusal repeats the token"
    assert await counter(scene.pilot, SIGNED) == signed, "the CA signed nothing"
    assert await counter(scene.pilot, MINTED) == minted, "SDS minted nothing"


async def test_the_expired_token_differs_from_an_accepted_one_by_its_age_alone(
    scene: Scene,
) -> None:
    """The control for the `expired` case: the Pod's token signed again as it is."""
    async with admin(scene.plane) as kube:
        token = await scene.workload.token(kube)
    same = signed_again(token, scene.plane.pki.sa_key)
    assert same != token, "signed again, the token is another string"
    assert await _certificate(scene, scene.pilot, same) == scene.workload.spiffe


# ------------------------------------------------------------------ --token-audience


async def test_token_audience_flag_is_the_audience_tokens_must_carry(scene: Scene) -> None:
    async with admin(scene.plane) as kube:
        mesh_ca = await scene.workload.token(kube, audience="mesh-ca")
        istio_ca = await scene.workload.token(kube)
        pilot = await start_discovery(
            kube, scene.plane, scene.folder / "mesh-ca", "--token-audience", "mesh-ca",
            ca=scene.ca, pod_name="pilot-mesh-ca",
        )  # fmt: skip
    try:
        uri = await _certificate(scene, pilot, mesh_ca)
        assert uri == scene.workload.spiffe
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await mint(pilot.target(tls=True), pilot.root_pem, istio_ca, _out(scene))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert '["istio-ca"] is invalid for the target audiences ["mesh-ca"]' in (
            refused.value.details() or ""
        )
    finally:
        await pilot.stop()
