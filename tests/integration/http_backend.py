"""`Backend`: the HTTP server behind the server Envoy in the mTLS tests.

Owns a small aiohttp server on an ephemeral port that answers every path with
`BACKEND_BODY` (status 200, or NNN for a path `/status/NNN/...`) and records
each request as `Seen` (its path and the `x-forwarded-client-cert` header the
server Envoy set, with a field reader).
Run as a process (a pod's app, `python -m tests.integration.http_backend`), it
also prints each request as one line, `seen {"path": ..., "xfcc": ...}`, for
the test reading its output. Each answer also carries that header back as
`x-seen-xfcc`, and the address the request came from as `x-seen-peer`, so a
client of a backend in another process sees what the app saw.
With `--call URL` it is also a caller, as bookinfo's reviews-v2 calls ratings: each
request first GETs URL (through the pod's sidecar, where capture rules send it),
prints how that went as `called {"url": ..., "status": ..., "body": ..., "seconds": ...}`
(status 0 when nothing answered), then answers as it would have anyway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
from aiohttp import web


@dataclass(frozen=True)
class Seen:
    """One request the backend received."""

    path: str
    xfcc: str

    def xfcc_field(self, key: str) -> str | None:
        """One field of the (single-element) x-forwarded-client-cert header, unquoted."""
        for part in _split_xfcc(self.xfcc):
            name, _, value = part.partition("=")
            if name == key:
                return urllib.parse.unquote(value.strip('"'))
        return None


def _split_xfcc(header: str) -> list[str]:
    parts, current, quoted = [], "", False
    for char in header:
        if char == '"':
            quoted = not quoted
        if char == ";" and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current] if current else parts


BACKEND_BODY = "hello from the shop backend"
SEEN_PREFIX = "seen "
CALLED_PREFIX = "called "
CALL_TIMEOUT = 10.0  # seconds; longer than any delay a test injects on the way


@dataclass(frozen=True)
class Called:
    """One call the backend made before answering: what answered (0: nothing), how fast."""

    url: str
    status: int
    body: str
    seconds: float


def called_line(called: Called) -> str:
    return CALLED_PREFIX + json.dumps(asdict(called))


def parse_called(line: str) -> Called | None:
    """The call a `called_line` records, None for any other line."""
    if not line.startswith(CALLED_PREFIX):
        return None
    return Called(**json.loads(line.removeprefix(CALLED_PREFIX)))


async def call(url: str) -> Called:
    """GET `url` (no proxy from the environment): its status and body, or status 0 and
    the error's name when nothing answered within CALL_TIMEOUT."""
    start = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
            status, body = response.status, await response.text()
    except (aiohttp.ClientError, TimeoutError) as error:
        status, body = 0, type(error).__name__
    return Called(url, status, body, round(time.monotonic() - start, 3))


def seen_line(seen: Seen) -> str:
    return SEEN_PREFIX + json.dumps(asdict(seen))


def parse_seen(line: str) -> Seen | None:
    """The request a `seen_line` records, None for any other line."""
    if not line.startswith(SEEN_PREFIX):
        return None
    return Seen(**json.loads(line.removeprefix(SEEN_PREFIX)))


def _status(path: str) -> int:
    """The status a request asks for by its path, `/status/503/...`; 200 for any other."""
    parts = path.split("/")
    if len(parts) > 2 and parts[1] == "status" and parts[2].isdigit() and len(parts[2]) == 3:
        return int(parts[2])
    return 200


@dataclass(frozen=True)
class Answer:
    """How a backend answers: its body (default: BACKEND_BODY and the path), its status,
    the first requests it fails with 503, how long it takes, and the URL it calls first
    (none when empty)."""

    body: str = ""
    status: int = 200
    fail_first: int = 0
    delay: float = 0.0
    call: str = ""


class Backend:
    """A small HTTP server on 127.0.0.1 (ephemeral port) that records every request."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        on_request: Callable[[Seen], None] | None = None,
        answer: Answer | None = None,
        on_call: Callable[[Called], None] | None = None,
    ) -> None:
        self.seen: list[Seen] = []
        self._on_request = on_request
        self._on_call = on_call
        self._runner: web.AppRunner | None = None
        self._answer = answer or Answer()
        self.host = host
        self.port = port

    async def _handle(self, request: web.Request) -> web.Response:
        seen = Seen(request.path, request.headers.get("x-forwarded-client-cert", ""))
        self.seen.append(seen)
        if self._on_request is not None:
            self._on_request(seen)
        headers = {"x-seen-xfcc": seen.xfcc, "x-seen-peer": request.remote or ""}
        answer = self._answer
        if answer.call:
            called = await call(answer.call)
            if self._on_call is not None:
                self._on_call(called)
        if answer.delay:
            await asyncio.sleep(answer.delay)
        status = answer.status if answer.status != 200 else _status(request.path)
        status = 503 if len(self.seen) <= answer.fail_first else status
        body = answer.body or f"{BACKEND_BODY} {request.path}"
        return web.Response(text=body, status=status, headers=headers)

    async def __aenter__(self) -> Backend:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server: Any = site._server  # aiohttp has no public accessor for the bound port
        self.port = int(server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def _serve(host: str, port: int, answer: Answer) -> None:
    """Serve until killed, saying so on stdout once bound (a pod's app, tests/support/pods)."""

    def report(seen: Seen) -> None:
        print(seen_line(seen), flush=True)

    def report_call(called: Called) -> None:
        print(called_line(called), flush=True)

    async with Backend(host, port, report, answer, report_call) as backend:
        print(f"serving on {backend.host}:{backend.port}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the test backend, as a process")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--body", default="", help="every answer's body")
    parser.add_argument("--status", type=int, default=200, help="every answer's status")
    parser.add_argument("--fail-first", type=int, default=0, help="503 to the first N requests")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--call", default="", help="a URL to GET before each answer")
    arguments = parser.parse_args()
    answer = Answer(
        arguments.body, arguments.status, arguments.fail_first, arguments.delay, arguments.call
    )
    asyncio.run(_serve(arguments.host, arguments.port, answer))
