"""`MtlsBackend`: an HTTP server behind mTLS, standing in for a pod's sidecar inbound.

Owns a Python `ssl` server on a loopback address (ephemeral port) that presents
a certificate it is given (signed by pilot's CA for some identity), requires a
client certificate from the same root, offers Istio's ALPN names, and records
each handshake that completed (`Handshake`: the SNI, the ALPN chosen, the
client's URI SANs). Each request gets 200 and `MTLS_BODY`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from cryptography import x509

from tests.support.ca import san_uris

MTLS_BODY = "hello over mTLS"
ALPN = ("istio-http/1.1", "istio-h2", "istio-peer-exchange", "istio")


@dataclass(frozen=True)
class Handshake:
    """One mTLS handshake the backend completed."""

    sni: str | None
    alpn: str | None
    peer_uris: tuple[str, ...]


class MtlsBackend:
    """An mTLS HTTP/1.1 server on `host` (port chosen by the kernel)."""

    def __init__(
        self, host: str, credentials: tuple[bytes, bytes], root_pem: str, workdir: Path
    ) -> None:
        self.host = host
        self.port = 0
        self.handshakes: list[Handshake] = []
        self._names: dict[int, str | None] = {}
        self._context = self._ssl_context(credentials, root_pem, workdir)
        self._server: asyncio.Server | None = None

    def _ssl_context(
        self, credentials: tuple[bytes, bytes], root_pem: str, workdir: Path
    ) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=root_pem)
        workdir.mkdir(parents=True, exist_ok=True)
        chain, key = workdir / f"{self.host}-chain.pem", workdir / f"{self.host}-key.pem"
        chain.write_bytes(credentials[0])
        key.touch(mode=0o600)
        key.write_bytes(credentials[1])
        context.load_cert_chain(chain, key)
        key.unlink()  # loaded: no key left on disk
        context.set_alpn_protocols(list(ALPN))
        context.sni_callback = self._sni
        return context

    def _sni(self, connection: Any, name: str | None, _context: ssl.SSLContext) -> None:
        self._names[id(connection)] = name

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = writer.get_extra_info("ssl_object")
        peer = x509.load_der_x509_certificate(connection.getpeercert(binary_form=True))
        self.handshakes.append(
            Handshake(
                self._names.pop(id(connection), None),
                connection.selected_alpn_protocol(),
                tuple(san_uris(peer)),
            )
        )
        try:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while await reader.readuntil(b"\r\n\r\n"):
                    body = MTLS_BODY.encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                        + f"content-length: {len(body)}\r\n\r\n".encode()
                        + body
                    )
                    await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                await writer.wait_closed()

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._handle, self.host, 0, ssl=self._context)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
