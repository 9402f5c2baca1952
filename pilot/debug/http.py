"""The HTTP port (`--http-addr`): `/ready`, `/metrics`, the debug page and JSON endpoints.

Debug endpoints answer only callers on loopback, unless `--debug-addr` gives
them a listener of their own (which then answers whoever can reach it, and
serves `/ready` and `/metrics` too, as Envoy's admin port does, so that every
link of the page works there; pilot warns at start when that listener is off
loopback). `/debug/` is the HTML page (`page.py`); `/` leads to it, as an
Envoy admin port or Istio's ControlZ opens on their page.

DNS rebinding: a page on `evil.example` that its DNS points at 127.0.0.1 is, to
a browser, same-origin with it, and the browser on the operator's machine is a
loopback caller. So every debug endpoint (and everything on the `--debug-addr`
listener) also checks the `Host:` header: it must name loopback (`localhost`,
127.0.0.0/8, `[::1]`, any port) or the address the caller connected to (a pod
IP, say); anything else is 403. A request with no `Host:` is answered: no
browser sends one. `/ready` and `/metrics` on `--http-addr` answer any Host
(kubelet probes and Prometheus name the pod, or a Service); they show no proxy.

Both listeners are pilot's own (`asyncio` servers for aiohttp's protocol), so that
each connection's first bytes are looked at before aiohttp reads them: a TLS or
HTTP/2 client is answered, counted and logged by `wrong_protocol`, in one line.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import hdrs, web

from pilot.debug import page, tasks, views
from pilot.debug.metrics import CONTENT_TYPE, Metrics
from pilot.debug.proxy_status import LiveProxies
from pilot.debug.wrong_protocol import FirstBytes, WrongProtocols
from pilot.logs import clipped
from pilot.push.history import PushHistory
from pilot.registry.authorization_policy import AuthorizationPolicies
from pilot.registry.index import EndpointIndex
from pilot.registry.request_authentication import RequestAuthentications
from pilot.registry.traffic_config import TrafficConfig
from pilot.settings import is_loopback_host, split_host_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger("pilot")


@dataclass(frozen=True)
class DebugState:
    """What the debug endpoints read."""

    proxies: LiveProxies
    index: EndpointIndex
    pushes: PushHistory
    traffic: TrafficConfig = field(default_factory=TrafficConfig)
    authz: AuthorizationPolicies = field(default_factory=AuthorizationPolicies)
    jwt: RequestAuthentications = field(default_factory=RequestAuthentications)


def _is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def _is_debug(request: web.Request) -> bool:
    return request.path == "/debug" or request.path.startswith("/debug/")


def host_of(header: str) -> str:
    """The host part of a `Host:` value: `[::1]:8080` -> `::1`, `a.b:80` -> `a.b`."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        return header.partition(":")[0]
    return header  # a name, an IPv4 address, or a bare IPv6 address


def _same_address(host: str, local: str) -> bool:
    try:
        named, bound = (ipaddress.ip_address(a.partition("%")[0]) for a in (host, local))
    except ValueError:
        return False
    unmapped = [
        a.ipv4_mapped or a if isinstance(a, ipaddress.IPv6Address) else a for a in (named, bound)
    ]
    return unmapped[0] == unmapped[1]


def names_this_listener(host_header: str | None, local_address: str | None) -> bool:
    """Whether a `Host:` value may be answered: none at all, loopback, or the local
    address of the connection (what the caller connected to)."""
    if host_header is None:
        return True
    host = host_of(host_header.strip())
    if is_loopback_host(host):
        return True
    return local_address is not None and _same_address(host, local_address)


def _local_address(request: web.Request) -> str | None:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return str(sockname[0]) if sockname else None


class _RefusedHosts:
    """Logs requests refused for their Host, one line per LOG_EVERY seconds at most."""

    LOG_EVERY = 10.0

    def __init__(self) -> None:
        self._logged_at: float | None = None
        self._quiet = 0

    def refused(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        if self._logged_at is not None and now - self._logged_at < self.LOG_EVERY:
            self._quiet += 1
        else:
            more = f" ({self._quiet} more since the last such line)" if self._quiet else ""
            log.warning(
                "refused %s from %s: Host %s names neither loopback nor this listener"
                " (DNS rebinding?)%s",
                clipped(request.path),
                request.remote,
                clipped(request.headers.get(hdrs.HOST, "")),
                more,
            )
            self._logged_at, self._quiet = now, 0
        return web.json_response(
            {"error": "the Host header must name loopback or this listener's address"},
            status=403,
        )


def _guard(
    *, everything: bool, loopback_callers: bool
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware: which requests check `Host:` (debug ones, or `everything`), and
    whether debug callers must be on loopback too (the --http-addr listener)."""
    hosts = _RefusedHosts()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not (everything or _is_debug(request)):
            return await handler(request)
        if loopback_callers and not _is_loopback(request.remote):
            return web.json_response(
                {"error": "debug endpoints answer on loopback only (see --debug-addr)"},
                status=403,
            )
        if not names_this_listener(request.headers.get(hdrs.HOST), _local_address(request)):
            return hosts.refused(request)
        return await handler(request)

    return guard


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

    async def configz(_request: web.Request) -> web.Response:
        return _json(views.configz(state.traffic, state.index))

    async def authorizationz(_request: web.Request) -> web.Response:
        return _json(views.authorizationz(state.authz, state.proxies, state.index, state.jwt))

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
        body = page.render(state.proxies, state.index, state.pushes, refresh, state.traffic)
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
        web.get("/debug/configz", configz),
        web.get("/debug/authorizationz", authorizationz),
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
        xds_ports: Callable[[], str] = str,
    ) -> None:
        self.host, self.port = split_host_port(address)
        # `xds_ports`: where xDS is, for a client that came to this port instead.
        self._wrong = WrongProtocols(metrics.http_wrong_protocol_for, xds_ports)
        self._listeners: list[asyncio.Server] = []
        self._is_ready = is_ready
        self._ready_detail = ready_detail  # a line per cluster, under /ready's first line
        self._metrics = metrics
        main = web.Application(
            middlewares=[] if debug_address else [_guard(everything=False, loopback_callers=True)]
        )
        main.add_routes(self._probe_routes())
        self._runners = [web.AppRunner(main, access_log=None)]
        self._addresses = [(self.host, self.port)]
        if debug_address is None:
            main.add_routes(debug_routes(debug))
        else:
            separate = web.Application(
                middlewares=[_guard(everything=True, loopback_callers=False)]
            )
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
            listener = await self._listen(runner, host, port)
            self._listeners.append(listener)
            ports.append(listener.sockets[0].getsockname()[1] if listener.sockets else port)
        self.port = ports[0]
        self.debug_port = ports[-1]
        if len(self._runners) > 1:
            # The bound port, for an operator (or a test) who asked for port 0.
            host = self._addresses[-1][0]
            log.info("debug endpoints on %s:%d", host, self.debug_port)
            if not is_loopback_host(host):
                log.warning(
                    "--debug-addr %s:%d is not a loopback address: anyone who reaches it"
                    " reads every proxy's configuration (/debug/config_dump)",
                    host,
                    self.debug_port,
                )

    async def _listen(self, runner: web.AppRunner, host: str, port: int) -> asyncio.Server:
        """A listener handing each connection to `runner`'s aiohttp protocol, through
        `FirstBytes` (what aiohttp's TCPSite does, but for that)."""
        make = runner.server
        assert make is not None, "set up first"
        wrong = self._wrong
        loop = asyncio.get_running_loop()
        return await loop.create_server(lambda: FirstBytes(make(), wrong), host, port)

    async def stop(self) -> None:
        for listener in self._listeners:  # no new connections, as aiohttp's sites stop first
            listener.close()
        self._listeners.clear()
        for runner in self._runners:
            await runner.cleanup()
