"""gRPC health and server reflection, with their requests decoded by pilot.

grpcio's own servicers do the work; the handlers registered here take raw
bytes and decode them first, so that a request that is no message of the
method's type is INVALID_ARGUMENT with one line, as on pilot's own services,
not UNKNOWN with a traceback from inside grpc.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import _async as reflection_aio
from grpc_reflection.v1alpha import reflection, reflection_pb2

from pilot.decoding import BadRequest, decode

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


def reflection_handler(service_names: Sequence[str]) -> grpc.GenericRpcHandler[Any, Any]:
    """`grpc.reflection.v1alpha.ServerReflection` describing `service_names`."""
    servicer = reflection_aio.ReflectionServicer(tuple(service_names))

    async def info(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[Any]:
        async def decoded() -> AsyncIterator[Any]:
            async for data in requests:
                yield await _decoded(reflection_pb2.ServerReflectionRequest, data, context)

        async for response in servicer.ServerReflectionInfo(decoded(), context):
            yield response

    methods = {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            info,
            request_deserializer=_identity,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
    }
    return grpc.method_handlers_generic_handler(reflection.SERVICE_NAME, methods)
