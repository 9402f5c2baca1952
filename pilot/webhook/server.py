"""The webhook's HTTPS listener (--webhook-addr, 15017): `POST /inject`, answered off the
event loop, with Istio's answers to bad input and pilot's bounds.

- `/inject` (or `/inject/`) only: any other path is 404, any other method 405.
- The body: at most 6 MiB, as Istio's webhook reads (a Content-Length over it is 400 at
  once, read no further; a chunked body is read until it passes it, then 400); none at all
  is 400; a body not complete within PILOT_INJECTION_BODY_TIMEOUT of its headers is 408;
  a caller that goes away before its body is complete is counted and logged (`aborted`),
  never a traceback.
  A refused body is never read further: the connection is closed after the answer.
- Bounds: PILOT_MAX_INJECTION_REVIEWS reviews at once and PILOT_MAX_INJECTION_BYTES of
  bodies held at once (being read, waiting, being answered); past either, 429. A
  connection that sends no complete request headers within the same timeout is closed.
- The review itself (JSON decoding, the template, the patch) runs on a few worker
  threads (`reviews.review`): a 6 MiB Pod never stalls xDS, and `/ready` keeps answering.
  Content-Type and decoding are the review's (415, 400); a Pod that cannot be injected is
  200 with allowed false and the message. A fault of pilot's own is 500, logged.

Every refusal is counted and logged by `refusals` (a line per kind at most every 10 s),
requests aiohttp cannot parse too (`refusals.parser_logger`): never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from pilot.settings import split_host_port
from pilot.webhook import refusals
from pilot.webhook.outcome import INJECTED, SKIPPED, Outcome, Reviewer
from pilot.webhook.refusals import InjectionStats, Refusals, parser_logger
from pilot.webhook.serving import WebhookCertificate
from pilot.webhook.settings import MAX_REVIEW_BYTES, WebhookSettings

log = logging.getLogger("pilot.webhook")

PATHS = frozenset({"/inject", "/inject/"})
HANDSHAKE_TIMEOUT = 10.0  # seconds for a TLS handshake: a half-open connection goes
KEEPALIVE_TIMEOUT = 30.0  # an idle kept-alive connection (the API server reuses them)
CHUNK = 64 * 1024
SHUTDOWN_GRACE = 2.0  # seconds, on stop, for requests under way


class _Refused(Exception):
    """A request refused before its review: the status, the kind, the reason."""

    def __init__(self, status: int, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.kind, self.reason = status, kind, reason


class _Budget:
    """Reviews and body bytes held at once, against their bounds."""

    def __init__(self, settings: WebhookSettings) -> None:
        self._settings = settings
        self.reviews = 0
        self.bytes = 0

    def take_bytes(self, count: int) -> None:
        if self.bytes + count > self._settings.max_bytes:
            raise _Refused(
                429,
                refusals.BUSY,
                f"more than {self._settings.max_bytes} bytes of reviews at once"
                " (PILOT_MAX_INJECTION_BYTES); retry later",
            )
        self.bytes += count


class _FirstRequestDeadline(asyncio.Protocol):
    """aiohttp's protocol, closed if no request has begun within `timeout` of the
    connection (aiohttp bounds neither slow request headers nor the wait for them); the
    handler disarms the deadline (`disarm`) when the first request begins."""

    def __init__(
        self, inner: Any, timeout: float, armed: dict[asyncio.BaseTransport, asyncio.TimerHandle]
    ) -> None:
        self._inner = inner
        self._timeout = timeout
        self._armed = armed
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        loop = asyncio.get_running_loop()
        self._armed[transport] = loop.call_later(self._timeout, self._expire, transport)
        self._inner.connection_made(transport)

    def _expire(self, transport: asyncio.BaseTransport) -> None:
        if self._armed.pop(transport, None) is not None:
            transport.close()

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self._inner.eof_received()
        return result

    def connection_lost(self, exc: Exception | None) -> None:
        disarm(self._armed, self._transport)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def disarm(armed: dict[asyncio.BaseTransport, asyncio.TimerHandle], transport: Any) -> None:
    """A connection's first-request deadline cancelled (its request began, or it closed)."""
    timer = armed.pop(transport, None) if transport is not None else None
    if timer is not None:
        timer.cancel()


class WebhookServer:
    """The listener, its worker threads, and what it counts."""

    def __init__(
        self,
        settings: WebhookSettings,
        certificate: WebhookCertificate,
        reviewer: Reviewer,
        stats: InjectionStats | None = None,
    ) -> None:
        self.host, self.port = split_host_port(settings.address)
        self.settings = settings
        self.certificate = certificate
        self.stats = stats or InjectionStats()
        self._reviewer = reviewer
        self._refusals = Refusals(self.stats)
        self._budget = _Budget(settings)
        self._armed: dict[asyncio.BaseTransport, asyncio.TimerHandle] = {}
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        # lingering_time 0: a body left unread closes the connection, never read further.
        self._runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=KEEPALIVE_TIMEOUT,
            lingering_time=0,
            # On stop, reviews under way get SHUTDOWN_GRACE to finish (an answer takes
            # milliseconds; what waits longer is a body still coming), not aiohttp's 60 s.
            shutdown_timeout=SHUTDOWN_GRACE,
            logger=parser_logger(self._refusals),
        )
        self._pool: ThreadPoolExecutor | None = None
        self._listener: asyncio.Server | None = None

    async def start(self) -> None:
        await self._runner.setup()
        make = self._runner.server
        assert make is not None
        timeout, armed = self.settings.body_timeout, self._armed
        self._pool = ThreadPoolExecutor(self.settings.workers, thread_name_prefix="webhook")
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            lambda: _FirstRequestDeadline(make(), timeout, armed),
            self.host,
            self.port,
            ssl=self.certificate.context,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
        )
        sockets = self._listener.sockets
        self.port = sockets[0].getsockname()[1] if sockets else self.port
        log.info(
            "sidecar injection webhook on %s:%d (POST /inject, TLS for %s)",
            self.host,
            self.port,
            ", ".join(self.certificate.dns_names),
        )

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        await self._runner.cleanup()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # -- one request -------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        disarm(self._armed, request.transport)
        try:
            return await self._answer(request)
        except _Refused as refused:
            return self._refused(request, refused)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if request.path not in PATHS:
            raise _Refused(404, refusals.NOT_FOUND, f"no such path {request.path!r}")
        if request.method != hdrs.METH_POST:
            raise _Refused(405, refusals.METHOD, f"{request.method} {request.path}: only POST")
        self.stats.requests += 1
        budget = self._budget
        if budget.reviews >= self.settings.max_reviews:
            raise _Refused(
                429,
                refusals.BUSY,
                f"more than {self.settings.max_reviews} reviews at once"
                " (PILOT_MAX_INJECTION_REVIEWS); retry later",
            )
        budget.reviews += 1
        held = 0
        try:
            body, held = await self._read_body(request)
            outcome = await self._review(body, request.headers.get(hdrs.CONTENT_TYPE))
        finally:
            budget.reviews -= 1
            budget.bytes -= held
        return self._respond(request, outcome)

    async def _read_body(self, request: web.Request) -> tuple[bytes, int]:
        """The body, and the bytes taken from the budget for it (`_Refused` past a bound;
        the budget is given back here then)."""
        length = request.content_length
        if length is not None and length > MAX_REVIEW_BYTES:
            raise _Refused(400, refusals.TOO_LARGE, _too_large(length))
        held = 0
        try:
            if length is not None:
                self._budget.take_bytes(length)
                held = length
            parts: list[bytes] = []
            size = 0
            async with asyncio.timeout(self.settings.body_timeout):
                while chunk := await request.content.read(CHUNK):
                    size += len(chunk)
                    if size > MAX_REVIEW_BYTES:
                        raise _Refused(400, refusals.TOO_LARGE, _too_large(size))
                    if size > held:  # chunked: taken as it comes
                        self._budget.take_bytes(size - held)
                        held = size
                    parts.append(chunk)
        except (ConnectionError, HttpProcessingError) as error:
            self._budget.bytes -= held  # the caller went away, or broke its own framing
            raise _Refused(
                400, refusals.ABORTED, f"the body ended before it was complete ({error!s})"
            ) from None
        except TimeoutError:
            self._budget.bytes -= held
            raise _Refused(
                408,
                refusals.SLOW,
                f"the body did not arrive within {self.settings.body_timeout:g}s"
                " (PILOT_INJECTION_BODY_TIMEOUT)",
            ) from None
        except BaseException:
            self._budget.bytes -= held
            raise
        if size == 0:
            self._budget.bytes -= held
            raise _Refused(400, refusals.EMPTY, "no body found")
        return b"".join(parts), held

    async def _review(self, body: bytes, content_type: str | None) -> Outcome:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, self._reviewer, body, content_type)
        except Exception as error:  # a fault of pilot's own: the Pod is refused (Fail)
            log.exception("injection webhook: the review failed")
            reason = f"internal error: {type(error).__name__}"
            return Outcome(500, f"{reason}\n".encode(), refusals.INTERNAL, reason)

    def _respond(self, request: web.Request, outcome: Outcome) -> web.Response:
        stats = self.stats
        if outcome.kind in (INJECTED, SKIPPED):
            stats.success += 1
            stats.skip += outcome.kind == SKIPPED
        else:
            stats.failure += 1
            self._refusals.refused(outcome.kind, _who(request), outcome.reason)
        return web.Response(
            status=outcome.status, body=outcome.body, content_type=outcome.content_type
        )

    def _refused(self, request: web.Request, refused: _Refused) -> web.Response:
        if refused.kind not in (refusals.NOT_FOUND, refusals.METHOD):
            self.stats.failure += 1
        self._refusals.refused(refused.kind, _who(request), refused.reason)
        headers = {hdrs.ALLOW: hdrs.METH_POST} if refused.status == 405 else {}
        response = web.Response(status=refused.status, text=f"{refused.reason}\n", headers=headers)
        response.force_close()  # whatever of the body is left is never read
        return response


def _too_large(size: int) -> str:
    return f"the body is {size} bytes or more: at most {MAX_REVIEW_BYTES}"


def _who(request: web.Request) -> str:
    return request.remote or "an unknown address"
