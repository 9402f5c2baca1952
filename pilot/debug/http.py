"""The HTTP port (`--http-addr`): `/ready`, `/metrics`, and the debug endpoints."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from pilot.debug.metrics import CONTENT_TYPE, Metrics
from pilot.settings import split_host_port


class HttpServer:
    """A small aiohttp server; `/ready` answers 200 once `is_ready()` says so."""

    def __init__(self, address: str, is_ready: Callable[[], bool], metrics: Metrics) -> None:
        self.host, self.port = split_host_port(address)
        self._is_ready = is_ready
        self._metrics = metrics
        app = web.Application()
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics_page)
        self._runner = web.AppRunner(app, access_log=None)

    async def _ready(self, _request: web.Request) -> web.Response:
        if self._is_ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready: registry not synced\n")

    async def _metrics_page(self, _request: web.Request) -> web.Response:
        body = self._metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_port=False)
        await site.start()
        server = site._server
        if self.port == 0 and server is not None and server.sockets:  # type: ignore[attr-defined]
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        await self._runner.cleanup()
