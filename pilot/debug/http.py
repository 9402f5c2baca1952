"""The HTTP port (`--http-addr`): `/ready`, `/metrics`, the debug page and JSON endpoints.

Debug endpoints answer only callers on loopback, unless `--debug-addr` gives
them a listener of their own (which then answers whoever can reach it, and
serves `/ready` and `/metrics` too, as Envoy's admin port does, so that every
link of the page works there). `/debug/` is the HTML page (`page.py`); `/`
leads to it, as an Envoy admin port or Istio's ControlZ opens on their page.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from pilot.debug import page, tasks, views
from pilot.debug.metrics import CONTENT_TYPE, Metrics
from pilot.debug.proxy_status import LiveProxies
from pilot.push.history import PushHistory
from pilot.registry.index import EndpointIndex
from pilot.settings import split_host_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger("pilot")


@dataclass(frozen=True)
class DebugState:
    """What the debug endpoints read."""

    proxies: LiveProxies
    index: EndpointIndex
    pushes: PushHistory


def _is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


@web.middleware
async def _loopback_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    debug = request.path == "/debug" or request.path.startswith("/debug/")
    if debug and not _is_loopback(request.remote):
        return web.json_response(
            {"error": "debug endpoints answer on loopback only (see --debug-addr)"}, status=403
        )
    return await handler(request)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=_dumps)


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def debug_routes(state: DebugState) -> list[web.RouteDef]:
    """The /debug/* routes."""

    async def syncz(_request: web.Request) -> web.Response:
        return _json(views.syncz(state.proxies))

    async def connections(_request: web.Request) -> web.Response:
        return _json(views.connections(state.proxies))

    async def edsz(request: web.Request) -> web.Response:
        try:
            return _json(views.edsz(state.proxies.cache, request.query.get("cluster")))
        except views.NotFound as missing:
            return _json({"error": str(missing)}, status=404)

    async def registryz(_request: web.Request) -> web.Response:
        return _json(views.registryz(state.index))

    async def config_dump(request: web.Request) -> web.Response:
        proxy_id = request.query.get("proxyID")
        if not proxy_id:
            return _json({"error": "proxyID is required, e.g. ?proxyID=<node id>"}, status=400)
        try:
            return _json(views.config_dump(state.proxies, proxy_id, request.query.get("identity")))
        except views.NotFound as missing:
            return _json({"error": str(missing)}, status=404)
        except views.Ambiguous as ambiguous:
            return _json({"error": str(ambiguous)}, status=409)

    async def task_dump(_request: web.Request) -> web.Response:
        return _json(tasks.tasks())

    async def pushz(_request: web.Request) -> web.Response:
        return _json(views.pushz(state.pushes))

    async def html_page(request: web.Request) -> web.Response:
        refresh = request.query.get("refresh") != "0"
        body = page.render(state.proxies, state.index, state.pushes, refresh)
        return web.Response(text=body, content_type="text/html", charset="utf-8")

    async def to_page(_request: web.Request) -> web.Response:
        raise web.HTTPFound("/debug/")

    return [
        web.get("/", to_page),
        web.get("/debug", html_page),
        web.get("/debug/", html_page),
        web.get("/debug/pushz", pushz),
        web.get("/debug/tasks", task_dump),
        web.get("/debug/syncz", syncz),
        web.get("/debug/connections", connections),
        web.get("/debug/edsz", edsz),
        web.get("/debug/registryz", registryz),
        web.get("/debug/config_dump", config_dump),
    ]


class HttpServer:
    """/ready, /metrics, and /debug (here on loopback, or on --debug-addr)."""

    def __init__(
        self,
        address: str,
        is_ready: Callable[[], bool],
        metrics: Metrics,
        debug: DebugState,
        debug_address: str | None = None,
        *,
        ready_detail: Callable[[], list[str]] = list,
    ) -> None:
        self.host, self.port = split_host_port(address)
        self._is_ready = is_ready
        self._ready_detail = ready_detail  # a line per cluster, under /ready's first line
        self._metrics = metrics
        main = web.Application(middlewares=[] if debug_address else [_loopback_only])
        main.add_routes(self._probe_routes())
        self._runners = [web.AppRunner(main, access_log=None)]
        self._addresses = [(self.host, self.port)]
        if debug_address is None:
            main.add_routes(debug_routes(debug))
        else:
            separate = web.Application()
            separate.add_routes([*debug_routes(debug), *self._probe_routes()])
            self._runners.append(web.AppRunner(separate, access_log=None))
            self._addresses.append(split_host_port(debug_address))
        self.debug_port = 0

    def _probe_routes(self) -> list[web.RouteDef]:
        return [web.get("/ready", self._ready), web.get("/metrics", self._metrics_page)]

    async def _ready(self, _request: web.Request) -> web.Response:
        detail = "".join(f"{line}\n" for line in self._ready_detail())
        if self._is_ready():
            return web.Response(text="ready\n" + detail)
        return web.Response(status=503, text="not ready: registry not synced\n" + detail)

    async def _metrics_page(self, _request: web.Request) -> web.Response:
        body = self._metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def start(self) -> None:
        ports = []
        for runner, (host, port) in zip(self._runners, self._addresses, strict=True):
            await runner.setup()
            site = web.TCPSite(runner, host, port, reuse_port=False)
            await site.start()
            ports.append(_bound_port(site, port))
        self.port = ports[0]
        self.debug_port = ports[-1]
        if len(self._runners) > 1:
            # The bound port, for an operator (or a test) who asked for port 0.
            log.info("debug endpoints on %s:%d", self._addresses[-1][0], self.debug_port)

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()


def _bound_port(site: web.TCPSite, requested: int) -> int:
    server = site._server
    if requested == 0 and server is not None and server.sockets:  # type: ignore[attr-defined]
        port: int = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return port
    return requested
