"""The `pilot` command as a user runs it: help, clear errors, clean shutdown, the names
in its TLS port's certificate."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from envoy.service.discovery.v3 import discovery_pb2

from tests.integration.tls_probe import served_certificate
from tests.support.deadline import bounded
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pilot_process import (
    pilot_environment,
    start_command,
    start_file_pilot_with_ca,
)

ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"


@contextmanager
def _closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound here, never listened on, while in use."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        yield port


async def _pilot(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pilot",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _asked_for_clusters(channel: grpc.aio.Channel) -> Any:
    """An ADS stream that has asked for every cluster (state of the world)."""
    call = channel.stream_stream(
        ADS,
        request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
        response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
    )()
    await call.write(discovery_pb2.DiscoveryRequest(type_url=CDS, node={"id": "n"}))
    return call


async def test_help_documents_every_flag() -> None:
    process = await _pilot("discovery", "--help")
    out, _ = await process.communicate()
    assert process.returncode == 0
    for flag in (
        "--grpc-addr",
        "--http-addr",
        "--config",
        "--cluster-domain",
        "--xds-cluster-name",
        "--log-level",
        "--kubeconfig",
        "--namespaces",
        "--endpoints-api",
        "PILOT_DEBOUNCE_AFTER",
    ):
        assert flag in out.decode(), flag


async def test_unreachable_cluster_is_a_one_line_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    with _closed_port() as port:
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
            "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        )
        process = await _pilot(
            "discovery", "--kubeconfig", str(kubeconfig), "--http-addr", "127.0.0.1:0"
        )
        _, err = await bounded(process.communicate(), 30)
    assert process.returncode == 2
    assert f"cannot reach the Kubernetes API server at http://127.0.0.1:{port}" in err.decode()
    assert "Traceback" not in err.decode()


async def test_sigterm_ends_streams_and_exits_zero(tmp_path: Path) -> None:
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh({"a": ["127.0.0.1"]}))
    command = [sys.executable, "-m", "pilot", "discovery", "--config", str(config)]
    command += ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]
    command += ["--grpc-tls-addr", "", "--webhook-addr", "", "--drain-duration", "1s"]
    command += ["--ca-state-dir", str(tmp_path / "ca")]
    pilot = await start_command(tmp_path, command, env=pilot_environment(tmp_path))
    try:
        status, _ = await pilot.get("/ready")
        assert status == 200
        async with grpc.aio.insecure_channel(pilot.target(tls=False)) as channel:
            call = await _asked_for_clusters(channel)
            first = await call.read()
            assert len(first.resources) == 1
            pilot.process.send_signal(signal.SIGTERM)
            try:
                ended = await bounded(call.read(), 5)
            except grpc.aio.AioRpcError as error:  # closed by the drain, or cancelled by stop
                assert error.code() == grpc.StatusCode.UNAVAILABLE
            else:
                assert ended is grpc.aio.EOF
        assert await bounded(pilot.process.wait(), 10) == 0
    finally:
        await pilot.stop()


async def test_a_mesh_from_a_file_is_served_without_the_kubernetes_client(
    tmp_path: Path,
) -> None:
    """Kubernetes' client library is half of pilot's start-up (0.7 s of 1.6 s here), and
    a mesh read from a file never calls an API server: pilot serves it, answers /ready
    and /metrics and a CDS stream, and never imports the library (`-X importtime` logs
    every import)."""
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh({"a": ["127.0.0.1"]}))
    command = [sys.executable, "-X", "importtime", "-m", "pilot", "discovery"]
    command += ["--config", str(config), "--grpc-addr", "127.0.0.1:0"]
    command += ["--http-addr", "127.0.0.1:0", "--ca-state-dir", str(tmp_path / "ca")]
    pilot = await start_command(tmp_path, command, env=pilot_environment(tmp_path))
    try:
        assert (await pilot.get("/ready"))[0] == 200
        assert "pilot_cluster_synced" in (await pilot.get("/metrics"))[1]
        async with grpc.aio.insecure_channel(pilot.target(tls=False)) as channel:
            call = await _asked_for_clusters(channel)
            assert len((await bounded(call.read(), 10)).resources) == 1
            call.cancel()
    finally:
        await pilot.stop()
    imports = pilot.logged(lambda e: e["msg"].startswith("import time:"))
    assert any(" pilot.app" in e["msg"] for e in imports), "importtime logged nothing"
    assert not [e["msg"] for e in imports if "kubernetes_asyncio" in e["msg"]]


def _dns_names(certificate: x509.Certificate) -> list[str]:
    san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName)


TLS_NAMES = {
    # --tls-dns-names: exactly the names given.
    ("--tls-dns-names", "xds.mesh.example,pilot.example.org"): [
        "xds.mesh.example",
        "pilot.example.org",
    ],
    # Without it: the Service's names (namespace `default`: no POD_NAMESPACE), in
    # --cluster-domain, and localhost.
    ("--cluster-domain", "example.org"): [
        "pilot",
        "pilot.default",
        "pilot.default.svc",
        "pilot.default.svc.example.org",
        "localhost",
    ],
}


@pytest.mark.parametrize("flags", list(TLS_NAMES), ids=lambda flags: flags[0])
async def test_the_tls_port_certificate_carries_the_names_asked_for(
    tmp_path: Path, flags: tuple[str, str]
) -> None:
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh({"a": ["127.0.0.1"]}))
    pilot = await start_file_pilot_with_ca(tmp_path, config, *flags)
    try:
        served = await served_certificate(pilot.tls_port, pilot.root_pem.decode())
    finally:
        await pilot.stop()
    assert _dns_names(served) == TLS_NAMES[flags]
