"""How pilot's ports behave: TLS xDS, one owner per port, connection age, draining."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pilot._gen.istio.v1.auth import ca_pb2
from pilot.app import Discovery
from pilot.security.certs import (
    KeyType,
    generate_key,
    key_pem,
    make_csr,
    self_signed_root,
    uri_sans,
)
from pilot.security.identity import Identity
from tests.integration.delta_proxy import Proxy
from tests.integration.envoy_ads_expectations import expected
from tests.support.deadline import bounded
from tests.support.envoy_process import EXAMPLES_DIR, EnvoyProcess, load_example_bootstrap
from tests.support.envoy_view import wait_for_view
from tests.support.mesh import cluster_name, simple_mesh
from tests.support.pilot import running_pilot
from tests.support.pilot_process import STOP_TIMEOUT, start_file_pilot_with_ca
from tests.support.xds_client import CLUSTER, Closed, DeltaStream, XdsClient, node

MESH = {"alpha": ["127.0.0.1"]}
CA_METHOD = "/istio.v1.auth.IstioCertificateService/CreateCertificate"


def _tls_channel(
    pilot_port: int, root_pem: str, client: tuple[bytes, bytes] | None = None
) -> grpc.aio.Channel:
    key, chain = client if client else (None, None)
    credentials = grpc.ssl_channel_credentials(root_pem.encode(), key, chain)
    options = [("grpc.ssl_target_name_override", "localhost")]
    return grpc.aio.secure_channel(f"127.0.0.1:{pilot_port}", credentials, options)


def _workload_cert(discovery: Discovery, identity: Identity) -> tuple[bytes, bytes]:
    """A key and chain from pilot's own CA, as a workload would hold them."""
    key = generate_key(KeyType.EC)
    ca = discovery.security.ca  # type: ignore[union-attr]
    chain = ca.sign(make_csr(key, [identity.uri]), identity, ca.settings.default_ttl)
    return key_pem(key), "".join(chain).encode()


async def _create_certificate(channel: grpc.aio.Channel) -> ca_pb2.IstioCertificateResponse:
    call = channel.unary_unary(
        CA_METHOD,
        request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
        response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
    )
    csr = make_csr(generate_key(KeyType.EC), ["spiffe://cluster.local/ns/evil/sa/admin"]).decode()
    response: ca_pb2.IstioCertificateResponse = await call(
        ca_pb2.IstioCertificateRequest(csr=csr), timeout=10
    )
    return response


async def test_tls_port_serves_xds_and_the_ca(tmp_path: Path) -> None:
    async with running_pilot(tmp_path, simple_mesh(MESH), grpc_tls_addr="127.0.0.1:0") as pilot:
        root = pilot.discovery.security.ca.root_pem  # type: ignore[union-attr]
        async with _tls_channel(pilot.discovery.grpc.tls_port, root) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _create_certificate(channel)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_ca_authenticates_client_certificates_when_required(tmp_path: Path) -> None:
    async with running_pilot(
        tmp_path, simple_mesh(MESH), grpc_tls_addr="127.0.0.1:0", tls_require_client_cert=True
    ) as pilot:
        discovery = pilot.discovery
        root = discovery.security.ca.root_pem  # type: ignore[union-attr]
        tls_port = discovery.grpc.tls_port
        workload = Identity("cluster.local", "shop", "cart")
        async with _tls_channel(tls_port, root, _workload_cert(discovery, workload)) as channel:
            chain = (await _create_certificate(channel)).cert_chain
            leaf = x509.load_pem_x509_certificate(chain[0].encode())
            assert uri_sans(leaf) == [workload.uri], "the caller's certificate names the identity"
        foreign_key, foreign_root = self_signed_root("cluster.local")
        forged_key = generate_key(KeyType.EC)
        forged = _forged_leaf(foreign_key, foreign_root, forged_key, workload)
        for client in ((key_pem(forged_key), forged), None):
            async with _tls_channel(tls_port, root, client) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await _create_certificate(channel)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, "no TLS without a good cert"


def _forged_leaf(ca_key: Any, ca_cert: x509.Certificate, key: Any, identity: Identity) -> bytes:
    """A certificate naming `identity`, signed by a CA pilot does not trust."""
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity.uri)]),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


async def test_envoy_over_the_tls_port_verifies_pilot_with_the_root(tmp_path: Path) -> None:
    async with running_pilot(tmp_path, simple_mesh(MESH), grpc_tls_addr="127.0.0.1:0") as pilot:
        root_file = tmp_path / "root-cert.pem"
        root_file.write_text(pilot.discovery.security.ca.root_pem)  # type: ignore[union-attr]
        bootstrap = load_example_bootstrap(
            "envoy-ads-delta.yaml", pilot.discovery.grpc.tls_port, "tls-node"
        )
        (xds,) = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "xds-grpc"]
        xds["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3"
                ".UpstreamTlsContext",
                "sni": "pilot.default.svc",
                "common_tls_context": {
                    "validation_context": {
                        "trusted_ca": {"filename": str(root_file)},
                        "match_typed_subject_alt_names": [
                            {"san_type": "DNS", "matcher": {"exact": "pilot.default.svc"}}
                        ],
                    }
                },
            },
        }
        async with EnvoyProcess(
            bootstrap, tmp_path / "envoy", "tls-node", log_level="warning"
        ) as envoy:
            await wait_for_view(envoy, expected(MESH), "clusters over the TLS port")


async def test_a_second_pilot_cannot_share_the_port(tmp_path: Path) -> None:
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    async with running_pilot(tmp_path / "one", simple_mesh(MESH)) as first:
        with pytest.raises(OSError, match="cannot listen"):
            async with running_pilot(
                tmp_path / "two", simple_mesh(MESH), grpc_addr=first.grpc_target
            ):
                pass


async def test_old_connections_are_closed(tmp_path: Path) -> None:
    async with (
        running_pilot(
            tmp_path, simple_mesh(MESH), max_connection_age=1.0, drain_duration=0.5
        ) as pilot,
        grpc.aio.insecure_channel(pilot.grpc_target) as channel,
    ):
        proxy = Proxy(channel, "aged")
        await proxy.subscribe("type.googleapis.com/envoy.config.cluster.v3.Cluster", ["*"])
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await bounded(proxy.call.read(), 15)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "max connection age" in str(ended.value.details())


async def _closed_at(stream: DeltaStream, within: float) -> float:
    """When (loop time) pilot ended `stream`, which has nothing more to receive."""
    event = await stream.next_event(within)
    assert isinstance(event, Closed), f"{stream.label}: a response instead of the end"
    return asyncio.get_running_loop().time()


async def _drained_streams(clients: list[XdsClient]) -> list[DeltaStream]:
    """One delta ADS stream per client, each with the clusters it asked for."""
    streams = []
    for number, client in enumerate(clients):
        stream = client.delta_ads(node(f"drained-{number}"))
        await stream.subscribe(CLUSTER, ["*"])
        await stream.ack_until(CLUSTER, [cluster_name("frontend")])
        streams.append(stream)
    return streams


async def _next_health(watch: Any, within: float) -> Any:
    """The next status a grpc.health.v1 Watch reports, within `within` seconds."""
    try:
        return (await bounded(watch.read(), within)).status
    except (TimeoutError, grpc.aio.AioRpcError) as error:
        pytest.fail(f"health reported no change within {within:g}s: {error!r}")


async def test_sigterm_drains_streams_gradually_then_exits_zero(tmp_path: Path) -> None:
    drain = 3.0
    pilot = await start_file_pilot_with_ca(
        tmp_path, EXAMPLES_DIR / "mesh.yaml", "--drain-duration", f"{drain:g}s"
    )
    clients = [XdsClient(pilot.target(tls=False)) for _ in range(4)]
    loop = asyncio.get_running_loop()
    stopping: asyncio.Task[None] | None = None
    try:
        streams = await _drained_streams(clients)
        request = health_pb2.HealthCheckRequest()
        health = health_pb2_grpc.HealthStub(clients[0].channel).Watch(request)
        assert await _next_health(health, 10) == health_pb2.HealthCheckResponse.SERVING
        ends = [asyncio.create_task(_closed_at(s, drain + STOP_TIMEOUT)) for s in streams]
        signalled = loop.time()
        stopping = asyncio.create_task(pilot.stop())  # SIGTERM; fails unless pilot exits 0
        assert await _next_health(health, drain) == health_pb2.HealthCheckResponse.NOT_SERVING
        not_serving = loop.time() - signalled
        health.cancel()  # a watch would hold pilot's gRPC server for the whole drain
        await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        async with XdsClient(pilot.target(tls=False)) as late:
            refused, _ = await late.delta_ads_status(deadline=drain + STOP_TIMEOUT)
        refused_at = loop.time() - signalled
        closed = sorted([await end - signalled for end in ends])
        await stopping
    finally:
        for client in clients:
            await client.aclose()
        if stopping is not None and not stopping.done():
            stopping.cancel()
        if pilot.alive:
            pilot.process.kill()
            await pilot.process.wait()
    shown = f"streams closed {[round(t, 2) for t in closed]}s after SIGTERM"
    # pilot closes them spread over the first half of the drain (4 streams: 3/8 of it
    # from first to last), so that their Envoys do not all reconnect at once.
    assert closed[-1] - closed[0] > drain / 4, f"not spread over the drain: {shown}"
    assert closed[-1] < drain, f"not all within --drain-duration {drain:g}s: {shown}"
    assert not_serving < closed[-1], f"NOT_SERVING only after {not_serving:.2f}s; {shown}"
    assert refused == grpc.StatusCode.UNAVAILABLE, f"a new stream during the drain: {refused}"
    assert refused_at < closed[-1], f"a new stream ended only after {refused_at:.2f}s; {shown}"
