"""No token and no private key on the plaintext port, by default in Kubernetes mode.

A pilot as users run it against a cluster, with no --plaintext-secrets: its
plaintext port serves clusters, endpoints, listeners and routes and asks for no credentials (a
token sent there is not even looked at), and serves neither SDS, the CA nor
CSDS; its TLS port serves all of them to callers that prove who they are.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from tests.support.ca import CaCaller, make_csr, reviews
from tests.support.deadline import bounded
from tests.support.mesh import cluster_name
from tests.support.peers import (
    BARRIER_SERVICES,
    ROOTCA,
    VICTIM,
    WAIT,
    WORKLOAD,
    Mesh,
    gets_its_secrets,
    running_mesh,
    victim,
)
from tests.support.xds_client import CLUSTER, LISTENER, SECRET, XdsClient, node

pytestmark = pytest.mark.asyncio(loop_scope="package")

SDS_SERVICE = "envoy.service.secret.v3.SecretDiscoveryService"
CA_SERVICE = "istio.v1.auth.IstioCertificateService"
CSDS_SERVICE = "envoy.service.status.v3.ClientStatusDiscoveryService"


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def default(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    async with running_mesh(tmp_path_factory.mktemp("default-ports")) as mesh:
        yield mesh


async def test_the_plaintext_port_serves_the_mesh_without_credentials(default: Mesh) -> None:
    before = len(reviews(default.srv))
    token = default.tokens[VICTIM]
    async with XdsClient(default.pilot.target(tls=False), token=token) as client:
        stream = client.delta_ads(node(default.node_id(), VICTIM.metadata))
        await stream.subscribe(CLUSTER, ["*"])
        arrived = await stream.ack_until(CLUSTER, [cluster_name(BARRIER_SERVICES[0])])
        assert cluster_name(BARRIER_SERVICES[0]) in arrived.names
        # Listeners and routes are the mesh's too: a sidecar on 15010 carries traffic.
        await stream.subscribe(LISTENER, ["*"])
        listeners = await stream.ack_until(LISTENER, ["virtualOutbound"])
        assert "virtualOutbound" in listeners.names
    assert len(reviews(default.srv)) == before, "a token on the plaintext port was reviewed"


async def test_the_plaintext_port_serves_no_secret_no_ca_and_no_csds(default: Mesh) -> None:
    node_id = default.node_id()
    mark = default.pilot.mark()
    async with XdsClient(default.pilot.target(tls=False)) as client:
        listed = await client.reflected_services()
        assert not listed & {SDS_SERVICE, CA_SERVICE, CSDS_SERVICE}, sorted(listed)
        stream = client.ads(node(node_id, VICTIM.metadata))
        await stream.subscribe(SECRET, [WORKLOAD, ROOTCA])
        await default.pilot.wait_logged(
            lambda e: "does not serve on this port" in e["msg"] and node_id in e["msg"],
            "that the plaintext port does not serve secrets",
            mark,
        )
        # Answered after the secret request was read: nothing came before it.
        await stream.subscribe(CLUSTER, ["*"])
        first = await stream.next_response()
        assert first.type_url == CLUSTER, "a secret on the plaintext port"
        with pytest.raises(grpc.aio.AioRpcError) as csds:
            await client.client_status()
        assert csds.value.code() == grpc.StatusCode.UNIMPLEMENTED
    async with CaCaller(default.pilot.target(tls=False)) as ca:
        _, csr = make_csr([VICTIM.uri])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ca.create(csr, token=default.tokens[VICTIM])
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_the_tls_port_serves_secrets_to_a_proven_caller_only(default: Mesh) -> None:
    async with default.pilot.client(tls=True, token=None) as anonymous:
        code, details = await anonymous.delta_ads_status()
        assert code == grpc.StatusCode.UNAUTHENTICATED, f"{code.name}: {details}"
    honest = victim(default, default.node_id(), tls=True, delta=True)
    try:
        await gets_its_secrets(honest)
        assert honest.workload is not None and honest.workload.uris == (VICTIM.uri,)
    finally:
        await honest.close()


async def _proxy_status(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pilot",
        "proxy-status",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await bounded(process.communicate(), WAIT)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_proxy_status_reads_csds_over_tls_with_a_token(default: Mesh, tmp_path: Path) -> None:
    honest = victim(default, default.node_id(), tls=True, delta=False)
    try:
        await gets_its_secrets(honest)
        code, _, err = await _proxy_status("--addr", default.pilot.target(tls=False))
        assert code == 2 and "UNIMPLEMENTED" in err and "--root-cert" in err, err
        root, token = tmp_path / "root-cert.pem", tmp_path / "token"
        root.write_text(default.ca.root.cert_pem)
        token.write_text(default.tokens[VICTIM])
        tls = default.pilot.target(tls=True)
        code, out, err = await _proxy_status("--addr", tls, "--root-cert", str(root))
        assert code == 2 and "UNAUTHENTICATED" in err and "--token-file" in err, err
        code, out, err = await _proxy_status(
            "--addr", tls, "--root-cert", str(root), "--token-file", str(token)
        )
        assert code == 0, err
        assert any(
            line.split()[:2] == [honest.stream.node.id, VICTIM.uri] for line in out.splitlines()
        )
    finally:
        await honest.close()
