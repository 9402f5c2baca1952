"""A pod's app for the JWT tests: it answers every request with what it received (the
path and every header, as JSON), so the client sees what Envoy let through to the app
(a removed token, a payload header); with `--jwks FILE` it is the issuer's key server
instead, answering `/jwks.json` with the file (over TLS with `--tls-cert` and
`--tls-key`: PEM files, the chain and its key).

Run as `python -m tests.integration.jwt_app --port P [--jwks FILE]`; it prints
`serving on HOST:PORT` when it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
from pathlib import Path

from aiohttp import web

JWKS_PATH = "/jwks.json"


def _echo(request: web.Request) -> web.Response:
    headers = {name.lower(): value for name, value in request.headers.items()}
    body = {"path": request.path_qs, "headers": headers}
    return web.Response(text=json.dumps(body), content_type="application/json")


def _keys(jwks: Path) -> web.Response:
    return web.Response(text=jwks.read_text(), content_type="application/json")


async def serve(host: str, port: int, jwks: Path | None, tls: ssl.SSLContext | None = None) -> None:
    async def handle(request: web.Request) -> web.Response:
        if jwks is not None:
            if request.path == JWKS_PATH:
                print(f"fetched {request.path}", flush=True)
                return _keys(jwks)
            return web.Response(status=404)
        return _echo(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=tls).start()
    print(f"serving on {host}:{port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--jwks", type=Path)
    parser.add_argument("--tls-cert", type=Path)
    parser.add_argument("--tls-key", type=Path)
    args = parser.parse_args()
    tls = None
    if args.tls_cert is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    asyncio.run(serve(args.host, args.port, args.jwks, tls))


if __name__ == "__main__":
    main()
