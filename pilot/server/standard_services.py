"""gRPC health and server reflection (v1alpha and v1), with their requests decoded by pilot.

grpcio's own servicers do the work; the handlers registered here take raw
bytes and decode them first, so that a request that is no message of the
method's type is INVALID_ARGUMENT with one line, as on pilot's own services,
not UNKNOWN with a traceback from inside grpc.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from google.protobuf import descriptor, descriptor_pool
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import _async as reflection_aio
from grpc_reflection.v1alpha import reflection, reflection_pb2

from pilot.decoding import BadRequest, decode
from pilot.server import reflection_v1

Context = grpc.aio.ServicerContext[Any, Any]


def _identity(data: bytes) -> bytes:
    return data


async def _decoded(message_class: Any, data: bytes, context: Context) -> Any:
    try:
        return decode(message_class, data)
    except BadRequest as error:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))


def health_handler(servicer: health_aio.HealthServicer) -> grpc.GenericRpcHandler[Any, Any]:
    """`grpc.health.v1.Health`: Check and Watch, answered by `servicer`."""

    async def check(data: bytes, context: Context) -> Any:
        request = await _decoded(health_pb2.HealthCheckRequest, data, context)
        return await servicer.Check(request, context)

    async def watch(data: bytes, context: Context) -> None:
        request = await _decoded(health_pb2.HealthCheckRequest, data, context)
        await servicer.Watch(request, context)

    serialize = health_pb2.HealthCheckResponse.SerializeToString
    methods = {
        "Check": grpc.unary_unary_rpc_method_handler(
            check, request_deserializer=_identity, response_serializer=serialize
        ),
        "Watch": grpc.unary_stream_rpc_method_handler(
            watch, request_deserializer=_identity, response_serializer=serialize
        ),
    }
    return grpc.method_handlers_generic_handler(health.SERVICE_NAME, methods)


REFLECTION_SERVICES = (reflection.SERVICE_NAME, reflection_v1.SERVICE_NAME)


class _SymbolPool:
    """The default descriptor pool, which also finds the file of a method.

    Reflection's `file_containing_symbol` may name a method (`pkg.Service.Method`,
    what `grpcurl describe` of a method asks); protobuf's upb pool finds the
    file of a service, message or field by name, but not of a method.
    """

    def __init__(self, pool: descriptor_pool.DescriptorPool) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, symbol: str) -> descriptor.FileDescriptor:
        """The file declaring `symbol`; KeyError (reflection's NOT_FOUND) if none does."""
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            return self._pool.FindMethodByName(symbol).containing_service.file


def reflection_handlers(
    service_names: Sequence[str],
) -> tuple[grpc.GenericRpcHandler[Any, Any], ...]:
    """Server reflection v1alpha and v1, both describing `service_names`.

    One servicer answers both: v1's messages are v1alpha's under another
    package (`reflection_v1`), so a v1 request, once decoded as one, is read
    as v1alpha's, and the v1alpha answer's bytes are the v1 answer.
    """
    pool = _SymbolPool(descriptor_pool.Default())
    servicer = reflection_aio.ReflectionServicer(tuple(service_names), pool=pool)
    return (
        _reflection_handler(
            servicer, reflection.SERVICE_NAME, reflection_pb2.ServerReflectionRequest
        ),
        _reflection_handler(
            servicer, reflection_v1.SERVICE_NAME, reflection_v1.ServerReflectionRequest
        ),
    )


def _reflection_handler(
    servicer: reflection_aio.ReflectionServicer, service_name: str, request_class: Any
) -> grpc.GenericRpcHandler[Any, Any]:
    """`service_name`'s ServerReflectionInfo, each request decoded as `request_class` first."""

    async def info(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[Any]:
        async def decoded() -> AsyncIterator[Any]:
            async for data in requests:
                # Refused naming the caller's own type; then read as the type the servicer knows.
                await _decoded(request_class, data, context)
                yield reflection_pb2.ServerReflectionRequest.FromString(data)

        async for response in servicer.ServerReflectionInfo(decoded(), context):
            yield response

    methods = {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            info,
            request_deserializer=_identity,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
    }
    return grpc.method_handlers_generic_handler(service_name, methods)
