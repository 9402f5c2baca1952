"""Real Envoys speak mTLS with the certificates pilot mints over SDS.

A *server* Envoy (ns `shop`, sa `server`) terminates mTLS on a static listener whose
`default` and `ROOTCA` secrets come over delta ADS, in front of a local HTTP backend. A
*client* Envoy (ns `web`, sa `client`, SotW ADS) routes plain HTTP to a static cluster
that speaks mTLS to the server Envoy with secrets from pilot's SecretDiscoveryService
and accepts only the server's SPIFFE identity. A request through both reaches the
backend, which learns the caller's identity from the server Envoy; a TLS client with no
certificate, or one from another CA, never gets a request through.
"""

from __future__ import annotations

from pathlib import Path

from pilot.security.ca import CaSettings, CertificateAuthority
from pilot.security.identity import Identity
from pilot.xds.proxy import ProxyKey
from tests.integration.envoy_tls_view import assert_envoy_holds, listener_ssl_stat
from tests.integration.http_backend import BACKEND_BODY
from tests.integration.mtls_pair import (
    CLIENT,
    MESH_SERVICES,
    SERVER,
    assert_client_cluster_verified,
    mtls_pair,
)
from tests.integration.tls_probe import probe_credentials, tls_get
from tests.support.envoy_process import EnvoyProcess
from tests.support.mesh import simple_mesh
from tests.support.pilot import RunningPilot, running_pilot
from tests.support.sds_secrets import served_workload

PROBE = Identity("cluster.local", "web", "probe")


async def _assert_holds_own_identity(
    envoy: EnvoyProcess, pilot: RunningPilot, proxy_id: str, uri: str
) -> None:
    """/certs shows exactly the certificate pilot serves this proxy, under pilot's root."""
    security = pilot.discovery.security
    assert security is not None
    served = served_workload(security.secrets, ProxyKey(proxy_id, uri))
    assert served is not None, f"pilot serves no certificate to {proxy_id}"
    await assert_envoy_holds(envoy, served.serial, uri, security.ca.root.serial_number)


async def test_request_crosses_mtls_between_two_envoys(tmp_path: Path) -> None:
    async with (
        running_pilot(tmp_path, simple_mesh(MESH_SERVICES)) as pilot,
        mtls_pair(pilot, tmp_path) as pair,
    ):
        await _assert_holds_own_identity(pair.server, pilot, SERVER.node_id, SERVER.uri)
        await _assert_holds_own_identity(pair.client, pilot, CLIENT.node_id, CLIENT.uri)

        status, body = await pair.get("/orders/17")

        assert (status, body) == (200, f"{BACKEND_BODY} /orders/17")
        assert [seen.path for seen in pair.backend.seen] == ["/orders/17"]
        # The server Envoy saw the client's certificate, the one pilot minted for it.
        seen = pair.backend.seen[0]
        assert seen.xfcc_field("URI") == CLIENT.uri
        assert seen.xfcc_field("By") == SERVER.uri
        security = pilot.discovery.security
        assert security is not None
        client_cert = served_workload(security.secrets, CLIENT)
        assert client_cert is not None
        assert seen.xfcc_field("Hash") == client_cert.leaf_sha256
        await assert_client_cluster_verified(pair)
        assert security.secrets.stats.minted == 2
        assert security.secrets.stats.ca_errors == 0


async def test_server_envoy_refuses_clients_without_a_certificate_from_pilot(
    tmp_path: Path,
) -> None:
    foreign_ca = CertificateAuthority.load(CaSettings(state_dir=tmp_path / "foreign-ca"))
    async with (
        running_pilot(tmp_path, simple_mesh(MESH_SERVICES)) as pilot,
        mtls_pair(pilot, tmp_path) as pair,
    ):
        security = pilot.discovery.security
        assert security is not None
        root = security.ca.root_pem

        no_cert = await tls_get(pair.mtls_port, root, tmp_path)
        assert no_cert.status_line is None, f"no client certificate, yet: {no_cert}"
        await pair.server.wait_for(
            lambda: listener_ssl_stat(pair.server, "fail_verify_no_cert"),
            10,
            "the listener to count a handshake without a client certificate",
            until=lambda count: count == 1,
        )

        foreign = probe_credentials(foreign_ca, PROBE)
        impostor = await tls_get(pair.mtls_port, root, tmp_path, client_pem=foreign)
        assert impostor.status_line is None, f"a foreign CA's certificate, yet: {impostor}"
        await pair.server.wait_for(
            lambda: listener_ssl_stat(pair.server, "fail_verify_error"),
            10,
            "the listener to count a certificate it could not verify",
            until=lambda count: count == 1,
        )
        assert pair.backend.seen == []

        # Control: the same probe with a certificate from pilot's CA gets through, and sees
        # the server Envoy's own certificate.
        genuine = probe_credentials(security.ca, PROBE)
        admitted = await tls_get(pair.mtls_port, root, tmp_path, client_pem=genuine)
        assert admitted.status_line == "HTTP/1.1 200 OK", admitted
        assert admitted.peer_uris == (SERVER.uri,)
        server_cert = served_workload(security.secrets, SERVER)
        assert server_cert is not None
        assert admitted.peer_serial == server_cert.serial
        assert [(s.path, s.xfcc_field("URI")) for s in pair.backend.seen] == [("/probe", PROBE.uri)]
