"""Clients that speak TLS or HTTP/2 to pilot's HTTP port, which speaks plain HTTP/1.1.

Such a client was almost surely meant for an xDS port (an Envoy bootstrap, grpcurl
or a kubelet probe given the wrong port, or `https://` for `http://`); aiohttp
logged a multi-line traceback for every HTTP/2 preface (each retry of a
misconfigured Envoy), and nothing at all for TLS. Each connection's first bytes are
looked at (`sniff`) before aiohttp gets them (`FirstBytes` wraps aiohttp's protocol):

- a TLS ClientHello (a handshake record: 0x16 0x03) or the HTTP/2 preface
  (`PRI * HTTP/2.0`) gets a one-line HTTP/1.1 400 naming the mistake, then the end
  of the stream; what the client still sends is read and dropped until it closes too
  (for LINGER seconds at most: closing with its bytes unread would reset the
  connection, and the client might never read the answer);
  `WrongProtocols` counts every one (`pilot_http_wrong_protocol_total{protocol}`) and
  logs one warning line naming the likely mistake and pilot's xDS ports, at most one
  per protocol per minute (saying how many more came since the last line);
- anything else is aiohttp's, byte for byte, so its own answers and log lines (a
  malformed HTTP/1 request) are what they were.

Only the connection's first bytes are held, and at most `len(HTTP2_PREFACE)` of them,
while they may still be one of the two; aiohttp's own timeouts and shutdown apply to
every connection from its start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Final, cast

log = logging.getLogger("pilot")

TLS, HTTP2 = "tls", "http2"  # the protocols counted, the metric's label values
TLS_RECORD: Final = b"\x16\x03"  # a TLS handshake record, any version: a ClientHello
HTTP2_PREFACE: Final = b"PRI * HTTP/2.0\r\n"  # the start of every HTTP/2 connection
_SIGNATURES: Final = ((TLS, TLS_RECORD), (HTTP2, HTTP2_PREFACE))
UNDECIDED: Final = "undecided"  # too few bytes yet to tell
LOG_EVERY = 60.0  # seconds between two lines about one protocol
LINGER = 2.0  # seconds a refused connection is kept for the client to read the answer

_WHO = {TLS: "a TLS client", HTTP2: "an HTTP/2 client (gRPC, or Envoy)"}


def sniff(first: bytes) -> str | None:
    """TLS or HTTP2 if a connection's first bytes are theirs, UNDECIDED while they may
    still be, None when they are neither (HTTP/1, or garbage: aiohttp's business)."""
    for protocol, signature in _SIGNATURES:
        if first.startswith(signature):
            return protocol
    if any(signature.startswith(first) for _, signature in _SIGNATURES):
        return UNDECIDED
    return None


class WrongProtocols:
    """Counts each wrong-protocol connection, and says so in a line per protocol per
    LOG_EVERY seconds at most.

    `count(protocol)` is the metric; `xds_ports()` says where xDS is (the ports the
    client was most likely meant for)."""

    def __init__(
        self,
        count: Callable[[str], None],
        xds_ports: Callable[[], str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._count = count
        self._xds_ports = xds_ports
        self._clock = clock
        self._logged_at: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()

    def answer(self, port: int) -> bytes:
        """What the client reads back: a plain HTTP/1.1 400 naming the mistake."""
        body = (
            f"this is pilot's HTTP port {port}: plain HTTP/1.1 (/ready, /metrics, /debug);"
            f" {self._xds_ports()}\n"
        ).encode()
        head = (
            "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode() + body

    def report(self, protocol: str, port: int, peer: str) -> None:
        self._count(protocol)
        now = self._clock()
        last = self._logged_at.get(protocol)
        if last is not None and now - last < LOG_EVERY:
            self._quiet[protocol] += 1
            return
        quiet = self._quiet.pop(protocol, 0)
        more = f" ({quiet} more since the last such line)" if quiet else ""
        log.warning(
            "%s on the HTTP port %d (from %s), which is plain HTTP/1.1: the wrong port? %s%s",
            _WHO[protocol],
            port,
            peer,
            self._xds_ports(),
            more,
        )
        self._logged_at[protocol] = now


def _address(info: object) -> tuple[str, int]:
    """(host, port) of a socket name, ("?", 0) when there is none (a Unix socket)."""
    if isinstance(info, tuple) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return "?", 0


class FirstBytes(asyncio.Protocol):
    """aiohttp's protocol for one connection (`inner`), its first bytes sniffed first."""

    def __init__(self, inner: asyncio.Protocol, wrong: WrongProtocols) -> None:
        self._inner = inner
        self._wrong = wrong
        self._transport: asyncio.Transport | None = None
        self._held = b""  # the first bytes, while UNDECIDED
        self._decided = False
        self._refused = False
        self._closing: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is one without deriving from asyncio.Transport).
        self._transport = cast(asyncio.Transport, transport)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._decided:
            self._inner.data_received(data)
            return
        if self._refused:
            return
        first = self._held + data
        protocol = sniff(first)
        if protocol == UNDECIDED:
            self._held = first
            return
        self._held = b""
        if protocol is None:
            self._decided = True
            self._inner.data_received(first)
            return
        self._refuse(protocol)

    def _refuse(self, protocol: str) -> None:
        self._refused = True
        transport = self._transport
        assert transport is not None
        _, port = _address(transport.get_extra_info("sockname"))
        peer, _ = _address(transport.get_extra_info("peername"))
        self._wrong.report(protocol, port, peer)
        transport.write(self._wrong.answer(port))
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._closing = asyncio.get_running_loop().call_later(LINGER, transport.close)

    def eof_received(self) -> bool | None:
        if self._refused:
            return None  # both ends done: the transport closes
        if self._held:  # a few bytes, then the end: aiohttp's
            self._decided = True
            self._inner.data_received(self._held)
            self._held = b""
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closing is not None:
            self._closing.cancel()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
