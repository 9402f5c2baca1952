"""The parties a hostile remote kubeconfig points pilot at, all on 127.0.0.1.

* `Recorder`: an HTTP or HTTPS server that answers every request 404 and keeps what it
  saw: the path, the `Authorization` header, and (over TLS) whether the caller presented
  a client certificate. Stands for an attacker's API server or OIDC issuer.
* `Silent`: a TCP server that accepts connections and never answers (a hung peer).
* `Pki`: a CA with a server certificate for 127.0.0.1 and a client certificate, and
  the TLS contexts a test API server uses with them; PEM files of each for kubeconfigs.
* `kubeconfig`: a kubeconfig document with the user and cluster fields a test chooses.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec

from tests.support.ca import Issuer, issue_leaf, new_ca, pem

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Seen:
    """One request an attacker's server received."""

    path: str
    authorization: str = field(repr=False)
    client_cert: bool


@dataclass
class Recorder:
    """An attacker's HTTP(S) server: records every request, answers 404."""

    ssl_context: ssl.SSLContext | None = None
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{LOOPBACK}:{self.port}"

    async def _record(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        self.seen.append(Seen(request.path, request.headers.get("Authorization", ""), bool(peer)))
        return web.Response(status=404, text="nothing here")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._record)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, LOOPBACK, 0, ssl_context=self.ssl_context)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@asynccontextmanager
async def recorder(ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[Recorder]:
    server = Recorder(ssl_context)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@dataclass
class Silent:
    """Accepts every connection, reads what comes, never answers."""

    connections: int = 0
    port: int = 0
    _server: asyncio.Server | None = None
    _held: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._held.append(writer)
        while await reader.read(65536):
            pass

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._hold, LOOPBACK, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        for writer in self._held:
            writer.close()
        if self._server is not None:
            self._server.close()


@asynccontextmanager
async def silent() -> AsyncIterator[Silent]:
    server = Silent()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files
    under `folder` (for kubeconfigs that name paths) and as bytes (for inline data)."""

    ca: Issuer
    server_cert: bytes
    server_key: bytes = field(repr=False)
    client_cert: bytes
    client_key: bytes = field(repr=False)
    folder: Path

    @classmethod
    def create(cls, folder: Path, name: str) -> Pki:
        folder.mkdir(parents=True, exist_ok=True)
        ca = new_ca(f"{name} ca")
        server_key = ec.generate_private_key(ec.SECP256R1())
        client_key = ec.generate_private_key(ec.SECP256R1())
        server = issue_leaf(ca, server_key.public_key(), hosts=[LOOPBACK])
        client = issue_leaf(ca, client_key.public_key(), uris=[f"spiffe://{name}/client"])
        pki = cls(
            ca,
            pem(server).encode(),
            Issuer(server_key, server).key_pem,
            pem(client).encode(),
            Issuer(client_key, client).key_pem,
            folder,
        )
        for file_name, data in pki.files().items():
            (folder / file_name).write_bytes(data)
        return pki

    def files(self) -> dict[str, bytes]:
        return {
            "ca.pem": self.ca.cert_pem.encode(),
            "server.pem": self.server_cert,
            "server-key.pem": self.server_key,
            "client.pem": self.client_cert,
            "client-key.pem": self.client_key,
        }

    def server_context(self, client_certs: ssl.VerifyMode) -> ssl.SSLContext:
        """A server's TLS context asking for client certificates from this CA."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.folder / "server.pem", self.folder / "server-key.pem")
        context.load_verify_locations(cadata=self.ca.cert_pem)
        context.verify_mode = client_certs
        return context


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def kubeconfig(server: str, user: dict[str, Any] | None = None, **cluster: Any) -> dict[str, Any]:
    """A kubeconfig for `server` with these user fields and cluster fields (`_` for `-`)."""
    body = {"server": server} | {k.replace("_", "-"): v for k, v in cluster.items()}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "remote", "cluster": body}],
        "users": [{"name": "remote", "user": dict(user or {})}],
        "contexts": [{"name": "remote", "context": {"cluster": "remote", "user": "remote"}}],
        "current-context": "remote",
    }
