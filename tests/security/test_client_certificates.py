"""A client certificate proves who a stream is, as a token does.

With `--grpc-tls-require-client-cert`, every caller of the TLS port presents a
certificate from pilot's CA, and its SPIFFE identity is what the stream proved
(no token needed). The same attack as with tokens: a certificate for
ns-a/attacker with the victim's node id gets the attacker a certificate for its
own identity, never the victim's, and pushes nothing to the victim; claiming
the victim's account in node metadata is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.support.ca import PluggedIn, issue_leaf, pem
from tests.support.peers import (
    ATTACKER,
    ROOTCA,
    VICTIM,
    WAIT,
    WORKLOAD,
    Account,
    Mesh,
    Peer,
    gets_its_secrets,
    running_mesh,
    show_all,
    wait_streams,
)
from tests.support.xds_client import XdsClient, node

pytestmark = pytest.mark.asyncio(loop_scope="package")


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def certified(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    """A pilot whose TLS port requires client certificates from its (plugged-in) CA."""
    folder = tmp_path_factory.mktemp("client-certificates")
    async with running_mesh(folder, "--grpc-tls-require-client-cert") as mesh:
        yield mesh


def _credentials(ca: PluggedIn, account: Account) -> grpc.ChannelCredentials:
    """TLS trusting pilot's root, presenting a certificate for `account` from pilot's CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = issue_leaf(ca.intermediate, key.public_key(), [account.uri])
    chain = (pem(leaf) + ca.intermediate.cert_pem).encode()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return grpc.ssl_channel_credentials(ca.root.cert_pem.encode(), key_pem, chain)


def _peer(mesh: Mesh, role: str, account: Account, node_id: str, claims: Account | None) -> Peer:
    client = XdsClient(mesh.pilot.target(tls=True), credentials=_credentials(mesh.ca, account))
    stream = client.ads(node(node_id, claims.metadata if claims else None))
    return Peer(
        role, account, client, stream, service="ads", barrier_clusters=mesh.barrier_clusters
    )


async def test_a_certificate_for_another_account_gets_that_account_only(
    certified: Mesh,
) -> None:
    node_id = certified.node_id()
    good = _peer(certified, "victim", VICTIM, node_id, VICTIM)
    bad = _peer(certified, "attacker", ATTACKER, node_id, None)
    try:
        await gets_its_secrets(good)
        assert good.workload is not None and good.workload.uris == (VICTIM.uri,)
        assert good.workload.key_matches_leaf
        held, serial = len(good.secrets), good.workload.serial

        await bad.ask([WORKLOAD])
        await bad.pump_until(lambda: bad.workload is not None, "certificate for `default`")
        assert bad.workload is not None and bad.workload.uris == (ATTACKER.uri,), (
            f"the attacker's client certificate got it {show_all(bad.certificates())}"
        )
        await good.barrier("answer to a request sent after the attacker subscribed")
        pushed = good.secrets[held:]
        assert not pushed, f"the victim's Envoy was pushed {show_all(pushed)}"
        assert good.workload.serial == serial
    finally:
        await bad.close()
        await good.close()


async def test_claiming_the_victims_account_with_another_certificate_is_refused(
    certified: Mesh,
) -> None:
    node_id = certified.node_id()
    liar = _peer(certified, "attacker", ATTACKER, node_id, VICTIM)
    try:
        await liar.ask([WORKLOAD, ROOTCA])
        await liar.accept(await liar.stream.next_event(WAIT))
        assert liar.closed is not None, f"the stream was served: {show_all(liar.secrets)}"
        assert liar.closed.code.name == "PERMISSION_DENIED", liar.closed.details
        assert ATTACKER.name in liar.closed.details, "the refusal names what was proven"
        await wait_streams(certified.pilot, node_id, 0)
    finally:
        await liar.close()
