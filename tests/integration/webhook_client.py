"""A caller of pilot's injection webhook, as the API server is one: HTTPS to 127.0.0.1,
verifying pilot's certificate against its root (the caBundle), for the name the API
server verifies (the Service's, `pilot.pilot-system.svc`, or `localhost`).

`post` sends a whole request with aiohttp; `raw` opens a TLS connection for a test that
writes the bytes itself (a lying Content-Length, a body that never ends); `patched`
decodes an answer's JSON patch.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from typing import Any

import aiohttp

from tests.support.deadline import bounded

TIMEOUT = 30.0


def client_context(root_pem: bytes) -> ssl.SSLContext:
    """Trusting pilot's root only, as the API server trusts the caBundle."""
    return ssl.create_default_context(cadata=root_pem.decode())


async def post(
    port: int,
    root_pem: bytes,
    body: bytes,
    *,
    content_type: str | None = "application/json",
    path: str = "/inject",
    method: str = "POST",
    server_name: str = "localhost",
) -> tuple[int, bytes]:
    """The status and body of one request to the webhook."""
    headers = {"Content-Type": content_type} if content_type else {}
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.request(
            method,
            f"https://127.0.0.1:{port}{path}",
            data=body,
            headers=headers,
            ssl=client_context(root_pem),
            server_hostname=server_name,
        ) as response,
    ):
        return response.status, await response.read()


async def raw(
    port: int, root_pem: bytes, server_name: str = "localhost"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TLS connection to the webhook, for a test that writes the request itself."""
    return await asyncio.open_connection(
        "127.0.0.1", port, ssl=client_context(root_pem), server_hostname=server_name
    )


async def status_of(reader: asyncio.StreamReader) -> int:
    """The status code of the answer on `reader` (its first line)."""
    line = await bounded(reader.readline(), TIMEOUT)
    return int(line.split()[1])


def response_of(body: bytes) -> dict[str, Any]:
    """The AdmissionReview's `response`."""
    review = json.loads(body)
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    response: dict[str, Any] = review["response"]
    return response


def patched(body: bytes) -> list[dict[str, Any]]:
    """The JSON patch of an answer that injected."""
    response = response_of(body)
    assert response["patchType"] == "JSONPatch", response
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch
