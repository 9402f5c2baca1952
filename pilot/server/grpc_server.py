"""The grpc.aio server: xDS services, gRPC health and server reflection on one port.

Other services (CSDS, the CA) are handed in by the composition root as
`ExtraService`s, so the shell knows nothing of what they do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

# Imported for their descriptors: server reflection describes these services.
from envoy.service.cluster.v3 import cds_pb2  # noqa: F401
from envoy.service.discovery.v3 import ads_pb2  # noqa: F401
from envoy.service.endpoint.v3 import eds_pb2  # noqa: F401
from envoy.service.secret.v3 import sds_pb2  # noqa: F401
from grpc import aio
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pilot.server.connection import StreamContext
from pilot.server.services import XDS_SERVICE_NAMES, xds_handlers

# A second pilot must not silently share the port (grpc enables SO_REUSEPORT by default).
_SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
]


@dataclass(frozen=True)
class ExtraService:
    """A gRPC service served beside xDS (its module imports its descriptors)."""

    name: str
    handler: grpc.GenericRpcHandler[Any, Any]


def _options(max_connection_age: float, drain: float) -> list[tuple[str, int]]:
    """Connections older than the age get GOAWAY (grpc adds +-10% jitter), then `drain`."""
    options = list(_SERVER_OPTIONS)
    if max_connection_age > 0:
        options.append(("grpc.max_connection_age_ms", int(max_connection_age * 1000)))
        options.append(("grpc.max_connection_age_grace_ms", int(drain * 1000)))
    return options


def _bind(server: aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as error:
        raise OSError(f"cannot listen on {address}: {error}") from error
    if port == 0:
        raise OSError(f"cannot listen on {address} (in use?)")
    return port


class GrpcServer:
    """xDS + health + reflection (+ extra services), bound to a plaintext and a TLS address."""

    def __init__(
        self,
        address: str,
        streams: StreamContext,
        *,
        extra: Sequence[ExtraService] = (),
        tls: tuple[str, grpc.ServerCredentials] | None = None,
        max_connection_age: float = 0.0,
        drain: float = 5.0,
    ) -> None:
        self.address = address
        self._streams = streams
        self.server = aio.server(options=_options(max_connection_age, drain))
        self.health = health_aio.HealthServicer()
        self.server.add_generic_rpc_handlers(tuple(xds_handlers(streams)))
        self.server.add_generic_rpc_handlers(tuple(service.handler for service in extra))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (
            *XDS_SERVICE_NAMES,
            *(service.name for service in extra),
            health.SERVICE_NAME,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, self.server)
        self.port = _bind(self.server, address, None)
        self.tls_port = _bind(self.server, *tls) if tls else 0

    async def start(self) -> None:
        """Listen; health says NOT_SERVING until `set_serving(True)`."""
        await self.set_serving(False)
        await self.server.start()

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *XDS_SERVICE_NAMES):
            await self.health.set(name, status)

    async def stop(self, drain: float) -> None:
        """Graceful: NOT_SERVING at once, stop accepting (GOAWAY), drain streams, stop.

        xDS streams are closed spread over the first half of `drain`, so that
        their Envoys reconnect to other replicas gradually rather than at once.
        """
        await self.set_serving(False)
        stopping = asyncio.create_task(self.server.stop(drain))
        await self._streams.connections.drain(drain / 2)
        await stopping


__all__ = ["ExtraService", "GrpcServer"]
