"""The grpc.aio servers: one per listening address, each with what that port serves.

A `Listener` says what one address serves: the xDS services for its stream
context (which types, which authentication), gRPC health, server reflection
(v1alpha and v1), and any other services the composition root hands it (CSDS,
the CA), each as an `ExtraService` so the shell knows nothing of what they do. Every listener
is its own grpc.aio server, so reflection and the registered services are
exactly what that port serves.
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
from grpc_health.v1 import health, health_pb2

from pilot.limits import Limits
from pilot.server.connection import StreamContext
from pilot.server.services import xds_handlers, xds_service_names
from pilot.server.standard_services import (
    REFLECTION_SERVICES,
    health_handler,
    reflection_handlers,
)

# A second pilot must not silently share the port (grpc enables SO_REUSEPORT by default).
_SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
]
# gRPC core holds a new stream in a queue until grpc.aio's loop picks it up, one at a time
# (~600 a second on a busy loop), and past 1,000 queued streams it drops them at random
# (CANCELLED, which Envoy meets with backoff): a reconnect storm of a few thousand Envoys
# lost a fifth of its streams that way. Pilot admits up to its stream limit, so the queue
# holds as many; past it pilot would refuse them anyway. A channel argument is 32 bits.
_PENDING_ARGS = ("grpc.server.max_pending_requests", "grpc.server.max_pending_requests_hard_limit")
_MAX_CHANNEL_INT = 2**31 - 1


@dataclass(frozen=True)
class ExtraService:
    """A gRPC service served beside xDS (its module imports its descriptors)."""

    name: str
    handler: grpc.GenericRpcHandler[Any, Any]


@dataclass(frozen=True)
class Listener:
    """One listening address: its streams' context, extra services, TLS credentials."""

    address: str
    streams: StreamContext
    extra: Sequence[ExtraService] = ()
    credentials: grpc.ServerCredentials | None = None


def _options(max_connection_age: float, drain: float, pending: int) -> list[tuple[str, int]]:
    """Up to `pending` new streams wait for the loop; connections older than the age get
    GOAWAY (grpc adds +-10% jitter), then `drain`."""
    options = list(_SERVER_OPTIONS)
    options += [(name, max(1, min(pending, _MAX_CHANNEL_INT))) for name in _PENDING_ARGS]
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
        # gRPC's own message is a GRPC_VERBOSITY hint; the reason went to its log.
        raise OSError(f"cannot listen on {address} (in use, or not an address here?)") from error
    if port == 0:
        raise OSError(f"cannot listen on {address} (in use?)")
    return port


class _Port:
    """One listener's grpc.aio server, bound."""

    def __init__(self, listener: Listener, options: list[tuple[str, int]]) -> None:
        self.listener = listener
        self.server = aio.server(options=options)
        self.health = health_aio.HealthServicer()
        self.server.add_generic_rpc_handlers(tuple(xds_handlers(listener.streams)))
        self.server.add_generic_rpc_handlers(tuple(s.handler for s in listener.extra))
        self.xds_names = xds_service_names(listener.streams)
        names = (
            *self.xds_names,
            *(service.name for service in listener.extra),
            health.SERVICE_NAME,
            *REFLECTION_SERVICES,
        )
        self.server.add_generic_rpc_handlers(
            (health_handler(self.health), *reflection_handlers(names))
        )
        self.port = _bind(self.server, listener.address, listener.credentials)

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.xds_names):
            await self.health.set(name, status)


class GrpcServer:
    """Every listener of pilot: started, health-flipped and drained together."""

    def __init__(
        self,
        listeners: Sequence[Listener],
        *,
        max_connection_age: float = 0.0,
        drain: float = 5.0,
        pending_streams: int = Limits().streams,
    ) -> None:
        options = _options(max_connection_age, drain, pending_streams)
        self._ports = [_Port(listener, options) for listener in listeners]

    @property
    def port(self) -> int:
        """The first plaintext port (0 if there is none)."""
        return next((p.port for p in self._ports if p.listener.credentials is None), 0)

    @property
    def streams(self) -> StreamContext:
        """What the xDS streams of the first port share (for in-process benches)."""
        return self._ports[0].listener.streams

    @property
    def tls_port(self) -> int:
        """The first TLS port (0 if there is none)."""
        return next((p.port for p in self._ports if p.listener.credentials is not None), 0)

    async def start(self) -> None:
        """Listen; health says NOT_SERVING until `set_serving(True)`."""
        await self.set_serving(False)
        for port in self._ports:
            await port.server.start()

    async def set_serving(self, serving: bool) -> None:
        for port in self._ports:
            await port.set_serving(serving)

    async def stop(self, drain: float) -> None:
        """Graceful: NOT_SERVING at once, stop accepting (GOAWAY), drain streams, stop.

        xDS streams are closed spread over the first half of `drain`, so that
        their Envoys reconnect to other replicas gradually rather than at once.
        """
        await self.set_serving(False)
        stopping = [asyncio.create_task(p.server.stop(drain)) for p in self._ports]
        drained = {id(p.listener.streams.connections): p.listener.streams for p in self._ports}
        await asyncio.gather(*(s.connections.drain(drain / 2) for s in drained.values()))
        await asyncio.gather(*stopping)


__all__ = ["ExtraService", "GrpcServer", "Listener"]
