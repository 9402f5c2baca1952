"""A TLS client and an HTTP/2 client pointed at pilot's HTTP port (15014), which speaks
plain HTTP/1.1, against a real `pilot discovery` subprocess.

Each such connection is answered with a one-line 400 naming the xDS ports, counted
exactly in `pilot_http_wrong_protocol_total{protocol}`, and logged as one warning line
naming the likely mistake, at most one per protocol per minute however many come;
no traceback, and the port still answers `/ready`. (Each HTTP/2 connection logged a
multi-line aiohttp traceback: a misconfigured Envoy retrying filled the log; a TLS
client was not logged at all.) A preface sent a byte at a time is told as well, and
a malformed HTTP/1 request is still aiohttp's 400. On either event loop.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import h2.config
import h2.connection
import pytest

from tests.support.deadline import bounded
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca

ROUNDS = 50  # connections of each protocol
WITHIN = 10.0
WINDOW = 60.0  # pilot's LOG_EVERY: a line per protocol per minute at most


async def _exchange(port: int, chunks: list[bytes]) -> bytes:
    """Send `chunks` one by one on a new connection; everything read until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
        return await bounded(reader.read(), WITHIN)
    finally:
        writer.close()


def _http2_request() -> bytes:
    """What an HTTP/2 client (python-hyper's h2) writes first: the preface, its
    SETTINGS and a GET /ready."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    headers = [(":method", "GET"), (":path", "/ready"), (":scheme", "http")]
    connection.send_headers(1, [*headers, (":authority", "127.0.0.1")], end_stream=True)
    return connection.data_to_send()


async def _tls_handshake(port: int) -> None:
    """A real TLS client's handshake with the HTTP port: it must fail."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with pytest.raises(ssl.SSLError):
        _reader, writer = await bounded(
            asyncio.open_connection("127.0.0.1", port, ssl=context), WITHIN
        )
        writer.close()


async def _counted(pilot: PilotProcess) -> dict[str, float]:
    _status, body = await pilot.get("/metrics")
    prefix = 'pilot_http_wrong_protocol_total{protocol="'
    found = {}
    for line in str(body).splitlines():
        if line.startswith(prefix):
            name, _, value = line.rpartition(" ")
            found[name[len(prefix) : -2]] = float(value)
    return found


def _lines(pilot: PilotProcess, who: str) -> list[str]:
    return [e["msg"] for e in pilot.logged(lambda e: e["msg"].startswith(who))]


@pytest.fixture(params=["asyncio", "uvloop"])
async def pilot(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[PilotProcess]:
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh({"web": ["10.1.0.1"]}))
    loop = {"PILOT_EVENT_LOOP": request.param}
    process = await start_file_pilot_with_ca(tmp_path, config, env=loop)
    yield process
    await process.stop()


async def test_tls_and_http2_clients_on_the_http_port(pilot: PilotProcess) -> None:
    assert await _counted(pilot) == {"tls": 0, "http2": 0}
    started = time.monotonic()
    request = _http2_request()
    for _ in range(ROUNDS):
        await _tls_handshake(pilot.http_port)
        answer = await _exchange(pilot.http_port, [request])
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
        xds = f"xDS (gRPC) is port {pilot.grpc_port} (--grpc-addr)"
        assert answer.endswith(f"over TLS port {pilot.tls_port} (--grpc-tls-addr)\n".encode())
        assert xds.encode() in answer, answer
    # The preface a byte at a time: still told, never handed to aiohttp.
    await _exchange(pilot.http_port, [bytes([b]) for b in request[:24]])
    assert await _counted(pilot) == {"tls": ROUNDS, "http2": ROUNDS + 1}
    assert await pilot.get("/ready") == (200, "ready\ncluster Kubernetes: synced\n")
    elapsed = time.monotonic() - started
    port = pilot.http_port
    for who in ("a TLS client", "an HTTP/2 client (gRPC, or Envoy)"):
        lines = _lines(pilot, who)
        assert 1 <= len(lines) <= 1 + elapsed // WINDOW, lines
        assert lines[0] == (
            f"{who} on the HTTP port {port} (from 127.0.0.1), which is plain HTTP/1.1:"
            f" the wrong port? xDS (gRPC) is port {pilot.grpc_port} (--grpc-addr),"
            f" over TLS port {pilot.tls_port} (--grpc-tls-addr)"
        )
    assert not [e for e in pilot.log if e["error"] or "aiohttp" in e["scope"]]


async def test_a_malformed_http1_request_is_still_aiohttps_400(pilot: PilotProcess) -> None:
    answer = await _exchange(pilot.http_port, [b"GET /ready HTTP/1.1\r\nBad Header\r\n\r\n"])
    assert answer.startswith(b"HTTP/1.0 400 Bad Request\r\n"), answer
    assert await _counted(pilot) == {"tls": 0, "http2": 0}
    assert await pilot.get("/ready") == (200, "ready\ncluster Kubernetes: synced\n")
