"""A pod's HTTP/1.1 app that records each request target exactly as it arrived.

aiohttp (tests/integration/http_backend) decodes and parses the target before a
handler sees it (`%2F` becomes `/`, `//x` an authority), so it cannot say which
spelling of a path Envoy forwarded. This one reads the request line itself and
prints `seen {"path": TARGET, "xfcc": ...}` (http_backend's line, so
tests/integration/mesh_pods reads it the same way), then answers 200 with the
target in the body, keeping the connection for the next request.
"""

from __future__ import annotations

import argparse
import asyncio
import json

MAX_HEAD = 256 * 1024  # bytes of a request's line and headers


def _head(raw: bytes) -> tuple[str, dict[str, str]]:
    """The request target and the headers (names lowercased) of one request's head."""
    line, *fields = raw.decode("latin-1").split("\r\n")
    _, target, _ = line.split(" ", 2)
    headers = {}
    for field in fields:
        name, _, value = field.partition(":")
        headers[name.strip().lower()] = value.strip()
    return target, headers


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            raw = await reader.readuntil(b"\r\n\r\n")
            target, headers = _head(raw[:-4])
            await reader.readexactly(int(headers.get("content-length", "0") or 0))
            seen = {"path": target, "xfcc": headers.get("x-forwarded-client-cert", "")}
            print("seen " + json.dumps(seen), flush=True)
            body = f"raw backend {target}".encode("latin-1", errors="replace")
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def _main(host: str, port: int) -> None:
    server = await asyncio.start_server(_serve_one, host, port, limit=MAX_HEAD)
    print(f"serving on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="an app that prints each request's target")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    arguments = parser.parse_args()
    asyncio.run(_main(arguments.host, arguments.port))
