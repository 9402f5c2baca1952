"""The mTLS pair: a client Envoy calling a server Envoy over mTLS with pilot's secrets.

Owns the two proxies (`SERVER`, `CLIENT`), starting the backend and both Envoys
until each holds its identity and serves (`mtls_pair`), sending a request
through them (`MtlsPair.get`), and checking the client cluster's handshakes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.integration.envoy_tls_view import STARTUP, listener_port, wait_for_own_cert
from tests.integration.http_backend import Backend
from tests.integration.mtls_bootstraps import (
    MTLS_LISTENER,
    PLAIN_LISTENER,
    SERVER_CLUSTER,
    client_bootstrap,
    server_bootstrap,
)
from tests.support.envoy_process import EnvoyProcess
from tests.support.pilot import RunningPilot
from tests.support.proxies import Proxy

SERVER = Proxy.sidecar("server-1", "shop", "server")
CLIENT = Proxy.sidecar("client-1", "web", "client")
# pilot must serve at least one cluster: over delta ADS, an empty mesh leaves Envoy's CDS
# waiting for its initial fetch timeout (10 s in the examples) before it goes LIVE.
MESH_SERVICES = {"catalog": ["127.0.1.1"]}


@dataclass
class MtlsPair:
    """Two Envoys, the backend behind them, and where to reach each."""

    server: EnvoyProcess
    client: EnvoyProcess
    backend: Backend
    mtls_port: int  # the server Envoy's mTLS listener
    http_port: int  # the client Envoy's plain-HTTP listener

    async def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:  # noqa: ASYNC109
        """GET through the client Envoy (plain HTTP) -> server Envoy (mTLS) -> backend."""
        url = f"http://127.0.0.1:{self.http_port}{path}"
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(url) as response,
        ):
            return response.status, await response.text()


@asynccontextmanager
async def mtls_pair(
    pilot: RunningPilot,
    workdir: Path,
    *,
    server_example: str = "envoy-ads-delta.yaml",
    client_example: str = "envoy-ads-sotw.yaml",
    client_sds_delta: bool = False,
) -> AsyncIterator[MtlsPair]:
    """Start the backend, the server Envoy, then the client Envoy; return once both serve.

    Ready means: each Envoy's /certs shows its own identity, both are LIVE, both
    listeners are bound, and the client's cluster has taken both secrets over SDS.
    """
    async with Backend() as backend:
        server_boot = server_bootstrap(
            pilot.grpc_port, SERVER, backend_port=backend.port, example=server_example
        )
        async with EnvoyProcess(server_boot, workdir / "server", "server") as server:
            await wait_for_own_cert(server, SERVER.uri)
            await server.wait_live(STARTUP)
            mtls_port = await server.wait_for(
                lambda: listener_port(server, MTLS_LISTENER), STARTUP, "the mTLS listener"
            )
            client_boot = client_bootstrap(
                pilot.grpc_port,
                CLIENT,
                server_port=mtls_port,
                server_san=SERVER.uri,
                example=client_example,
                sds_delta=client_sds_delta,
            )
            async with EnvoyProcess(client_boot, workdir / "client", "client") as client:
                await wait_for_own_cert(client, CLIENT.uri)
                await client.wait_live(STARTUP)
                http_port = await client.wait_for(
                    lambda: listener_port(client, PLAIN_LISTENER), STARTUP, "the HTTP listener"
                )
                await client.wait_for_stat(
                    f"cluster.{SERVER_CLUSTER}.client_ssl_socket_factory.ssl_context_update_by_sds",
                    lambda value: isinstance(value, int) and value >= 2,
                    STARTUP,
                )
                yield MtlsPair(server, client, backend, mtls_port, http_port)


async def assert_client_cluster_verified(pair: MtlsPair) -> None:
    """The client Envoy's mTLS cluster handshook, with no connection or verification failure."""
    stats = await pair.client.stats(regex=rf"^cluster\.{SERVER_CLUSTER}\.ssl\.")
    prefix = f"cluster.{SERVER_CLUSTER}.ssl."
    assert int(stats[prefix + "handshake"]) >= 1
    failures = ("connection_error", "fail_verify_error", "fail_verify_san", "fail_verify_no_cert")
    assert {name: stats[prefix + name] for name in failures} == dict.fromkeys(failures, 0)
