"""`python -m tests.kubeapi`: run the test API server standalone (benchmarks).

Owns the command line and a tiny control API (no auth, not recorded) through
which another process mutates state or flips faults:
  POST /_test/apply          body: an object or a kind: List  -> the applied objects
  POST /_test/delete         body: {"kind", "namespace", "name"}
  POST /_test/load           body: YAML text (multi-document or kind: List)
  POST /_test/compact | /_test/expire_watches | /_test/drop_watches | /_test/bookmarks
  POST /_test/fail_lists     body: {"n": N or null}
  GET  /_test/stats          -> {"resourceVersion", "openWatches", "requests"}
Prints "kubeapi listening on <url>" once serving; stops on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from .kubeconfig import write_kubeconfig
from .server import KubeAPIServer
from .store import ApiError
from .wire import json_response, status_response

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def control_routes(srv: KubeAPIServer) -> list[web.RouteDef]:
    """The /_test/* routes for srv."""

    def guarded(action: Callable[[Any], Any]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            try:
                return json_response({"result": action(body)})
            except ApiError as error:
                return status_response(error)
            except (ValueError, KeyError, TypeError) as error:
                return status_response(ApiError(400, "BadRequest", str(error)))

        return handler

    def apply(raw: bytes) -> list[dict[str, Any]]:
        return srv.load_yaml(raw.decode())  # JSON is YAML

    def delete(raw: bytes) -> dict[str, Any]:
        spec = _json(raw)
        return srv.delete(spec["kind"], spec.get("namespace"), spec["name"])

    def fail_lists(raw: bytes) -> None:
        srv.fail_lists((_json(raw) or {}).get("n"))

    def stats(_: bytes) -> dict[str, Any]:
        return {
            "resourceVersion": srv.resource_version,
            "openWatches": srv.open_watches,
            "requests": len(srv.requests),
        }

    return [
        web.post("/_test/apply", guarded(apply)),
        web.post("/_test/load", guarded(apply)),
        web.post("/_test/delete", guarded(delete)),
        web.post("/_test/compact", guarded(lambda _: srv.compact())),
        web.post("/_test/expire_watches", guarded(lambda _: srv.expire_watches())),
        web.post("/_test/drop_watches", guarded(lambda _: srv.drop_watches())),
        web.post("/_test/bookmarks", guarded(lambda _: srv.send_bookmarks())),
        web.post("/_test/fail_lists", guarded(fail_lists)),
        web.get("/_test/stats", guarded(stats)),
    ]


def _json(raw: bytes) -> Any:
    return json.loads(raw or b"null")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.kubeapi",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the server here")
    parser.add_argument("--load", type=Path, action="append", default=[], help="YAML to apply")
    parser.add_argument("--token", help="require this bearer token (also put in kubeconfig)")
    parser.add_argument("--bookmark-interval", type=float, default=1.0)
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    srv = KubeAPIServer(
        args.port,
        host=args.host,
        require_token=args.token,
        bookmark_interval=args.bookmark_interval,
    )
    srv.extra_routes.extend(control_routes(srv))
    for path in args.load:
        srv.load_yaml(path.read_text(encoding="utf-8"))
    await srv.start()
    if args.kubeconfig:
        write_kubeconfig(args.kubeconfig, srv.url, token=args.token)
    print(f"kubeapi listening on {srv.url}", flush=True)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    await srv.stop()


def main(argv: list[str] | None = None) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
