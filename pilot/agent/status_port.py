"""The agent's status port (Istio's 15020): held by the agent, so that no app can take it.

The capture rules leave 15020 uncaptured (`pilot.agent.iptables`, `-d`), as Istio's
do, because Istio's agent listens there. An app that listened on it would be reached
in plaintext past Envoy, whatever a STRICT PeerAuthentication says. So `pilot agent
--binary-path` binds 0.0.0.0:`--status-port` (default 15020, Istio's ProxyConfig
`statusPort`; 0: none, as Istio) before anything else it does, and fails to start
when the port is taken: a sidecar without its status port would leave the bypass open.

It serves `GET /healthz/ready`: 200 once Envoy's admin `/ready` (127.0.0.1:15000)
answers 200 (Envoy is LIVE), 503 otherwise; `POST /quitquitquit` (Istio's, for a
Job whose app is done): 200, then the agent stops Envoy and exits 0, but only for a
caller on loopback (127.0.0.1 or ::1: the pod's own containers), never 127.0.0.6,
the source of what Envoy passes through from outside, nor any other address (403);
and `GET /app-health/CONTAINER/livez|readyz|startupz`, the app's rewritten probes
(`pilot.agent.app_probes`). Every other path is 404, every other method 405. The
answers are fixed text: nothing of the pod, its keys or its token.

Anyone in the cluster reaches this port, so it is bounded: one request per
connection, its head (request line and headers) at most MAX_HEAD_BYTES and sent
within HEAD_TIMEOUT, at most MAX_PER_PEER connections open from one address and
MAX_CONNECTIONS in all (more are closed at once). A client that sends slowly or
never holds a few descriptors for HEAD_TIMEOUT at most, and never the event loop
that serves SDS.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pilot.agent.app_probes import AppProber, probe

log = logging.getLogger("pilot.agent")

DEFAULT_STATUS_PORT = 15020
READY_PATH = "/healthz/ready"
QUIT_PATH = "/quitquitquit"
LOOPBACK = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})  # not 127.0.0.6: Envoy's source
MAX_HEAD_BYTES = 8192
HEAD_TIMEOUT = 5.0  # seconds to send the request's head (kubelet sends it at once)
ENVOY_TIMEOUT = 1.0  # seconds for Envoy's admin to answer /ready
MAX_CONNECTIONS = 256
MAX_PER_PEER = 16
_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 503: "Service Unavailable"}  # fmt: skip


class StatusPortError(OSError):
    """The status port cannot be bound; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A status code and its (fixed) text."""

    status: int
    text: str

    def encoded(self, head_only: bool) -> bytes:
        body = self.text.encode()
        head = (
            f"HTTP/1.1 {self.status} {_REASONS[self.status]}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        return head.encode() + (b"" if head_only else body)


BAD_REQUEST = Answer(400, "bad request\n")
NOT_FOUND = Answer(404, "not found\n")
NOT_ALLOWED = Answer(405, "method not allowed\n")
READY = Answer(200, "ready\n")
NOT_READY = Answer(503, "not ready: Envoy is not LIVE\n")
QUITTING = Answer(200, "stopping\n")
LOOPBACK_ONLY = Answer(403, "forbidden: loopback callers only\n")
APP_HEALTHY = Answer(200, "app probe passed\n")
APP_UNHEALTHY = Answer(503, "app probe failed\n")


def request_target(head: bytes) -> tuple[str, str] | None:
    """(method, path without its query) from a request's head; None when malformed."""
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return None
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None
    return method, target.partition("?")[0]


async def envoy_ready(admin_port: int) -> bool:
    """Whether Envoy's admin `/ready` answers 200 within ENVOY_TIMEOUT."""
    try:
        async with asyncio.timeout(ENVOY_TIMEOUT):
            reader, writer = await asyncio.open_connection("127.0.0.1", admin_port)
            try:
                # HTTP/1.1: Envoy's admin answers HTTP/1.0 with 426 Upgrade Required.
                writer.write(b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                await writer.drain()
                status_line = await reader.readline()
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return False
    return status_line.split(b" ")[1:2] == [b"200"]


@dataclass(frozen=True, slots=True)
class StatusRoutes:
    """What the status port answers besides readiness: quitting, and the app's probes."""

    on_quit: Callable[[], None] | None = None  # POST /quitquitquit; None: 404
    probers: Mapping[str, AppProber] | None = None  # by path: /app-health/C/livez ...
    pod_ip: str = ""  # where the app's probes go


class StatusServer:
    """`/healthz/ready` on 0.0.0.0:`port`, bound by `start` (StatusPortError if it cannot)."""

    def __init__(
        self,
        port: int,
        admin_port: int,
        host: str = "0.0.0.0",
        routes: StatusRoutes | None = None,
    ) -> None:
        self.port = port
        self.host = host
        self._routes = routes or StatusRoutes()
        self._admin_port = admin_port
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._per_peer: Counter[str] = Counter()

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._connected, self.host, self.port, limit=MAX_HEAD_BYTES, reuse_port=False
            )
        except OSError as error:
            raise StatusPortError(
                f"--status-port {self.port}: cannot listen on {self.host}:{self.port}"
                f" ({error.strerror or error}): another process holds the sidecar's status"
                " port, which the capture rules leave uncaptured; the agent does not start"
                " without it"
            ) from None
        log.info("status port %s:%d: %s", self.host, self.port, READY_PATH)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._open):
            writer.transport.abort()
        await self._server.wait_closed()
        self._server = None

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        if len(self._open) >= MAX_CONNECTIONS or self._per_peer[address] >= MAX_PER_PEER:
            writer.transport.abort()
            return
        self._open.add(writer)
        self._per_peer[address] += 1
        try:
            await self._serve(reader, writer, address)
        finally:
            self._open.discard(writer)
            self._per_peer[address] -= 1
            if not self._per_peer[address]:
                del self._per_peer[address]
            if not writer.is_closing():  # slow, cut short or too long: dropped
                writer.transport.abort()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        """Read one request's head within HEAD_TIMEOUT, answer it, close."""
        try:
            async with asyncio.timeout(HEAD_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            return  # slow, cut short or too long: nothing is owed
        target = request_target(head)
        answer = await self._answer(target, peer)
        writer.write(answer.encoded(head_only=target is not None and target[0] == "HEAD"))
        try:
            async with asyncio.timeout(HEAD_TIMEOUT):
                await writer.drain()
        except (TimeoutError, OSError):
            return
        writer.close()  # one request per connection (the answer says Connection: close)
        if answer is QUITTING and self._routes.on_quit is not None:
            self._routes.on_quit()  # once answered: the caller learns it was heard

    async def _answer(self, target: tuple[str, str] | None, peer: str) -> Answer:
        if target is None:
            return BAD_REQUEST
        method, path = target
        if path == QUIT_PATH and self._routes.on_quit is not None:
            return self._quit(method, peer)
        prober = (self._routes.probers or {}).get(path)
        if path != READY_PATH and prober is None:
            return NOT_FOUND
        if method not in ("GET", "HEAD"):
            return NOT_ALLOWED
        if prober is not None:
            healthy = await probe(prober, self._routes.pod_ip)
            return APP_HEALTHY if healthy else APP_UNHEALTHY
        return READY if await envoy_ready(self._admin_port) else NOT_READY

    def _quit(self, method: str, peer: str) -> Answer:
        if method != "POST":
            return NOT_ALLOWED
        if peer not in LOOPBACK:
            log.debug("POST %s from %s refused: loopback callers only", QUIT_PATH, peer)
            return LOOPBACK_ONLY
        log.info("POST %s from %s: stopping Envoy and the agent", QUIT_PATH, peer)
        return QUITTING
