"""An app with health endpoints, for the rewritten-probe tests: HTTP and gRPC.

`python -m tests.integration.probe_app HTTP_PORT GRPC_PORT [HTTPS_PORT CERT KEY]`
serves HTTP on 0.0.0.0:HTTP_PORT (and the same over TLS on HTTPS_PORT, with CERT and
KEY): `/healthz` 200, `/fail` 500, `/moved` a 302 to an address off the pod,
`/headers` 200 only when the request carries `x-probe: yes`; each request is printed
as `probe PEER METHOD PATH`. On GRPC_PORT, grpc.health.v1: the server ("") SERVING,
`down` NOT_SERVING. It prints `serving` once both listen.
"""

from __future__ import annotations

import asyncio
import ssl
import sys

import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def _http_app() -> web.Application:
    async def answer(request: web.Request) -> web.StreamResponse:
        print(f"probe {request.remote} {request.method} {request.path}", flush=True)
        if request.path == "/healthz":
            return web.Response(text="ok")
        if request.path == "/moved":
            return web.Response(status=302, headers={"Location": "http://198.18.0.9:9/"})
        if request.path == "/headers":
            return web.Response(status=200 if request.headers.get("x-probe") == "yes" else 400)
        return web.Response(status=500, text="failing")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


async def main(http_port: int, grpc_port: int, tls: list[str]) -> None:
    runner = web.AppRunner(_http_app())
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", http_port).start()
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls[1], tls[2])
        await web.TCPSite(runner, "0.0.0.0", int(tls[0]), ssl_context=context).start()
    server = grpc.aio.server()
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    await checks.set("down", health_pb2.HealthCheckResponse.NOT_SERVING)
    server.add_insecure_port(f"0.0.0.0:{grpc_port}")
    await server.start()
    print("serving", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:6]))
