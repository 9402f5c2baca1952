"""A client of a real Envoy's outbound listeners on loopback: `free_port` picks a port
for a service (Envoy binds it), `get` sends GET / through the listener on it, naming
the service in `Host:` as a client on the machine would.
"""

from __future__ import annotations

import socket

import aiohttp


def free_port() -> int:
    """A loopback port nobody listens on now (Envoy binds it as a service port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def get(port: int, host: str) -> tuple[int, str]:
    """GET / through Envoy's listener on 127.0.0.1:port, naming `host`."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}/", headers={"Host": host}) as response,
    ):
        return response.status, await response.text()
