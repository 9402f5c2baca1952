"""The xDS gRPC services: ADS (SotW and delta), the standalone CDS, EDS and SDS services.

Handlers are registered generically with an identity response serializer:
responses are already wire bytes, assembled from resources encoded once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from pilot.limits import LimitExceeded
from pilot.protocol import ProtocolError, SotwStream
from pilot.protocol.kind import StreamKind
from pilot.server import convert, intake
from pilot.server.connection import Connection, StreamContext
from pilot.xds import types
from pilot.xds.flavor import Flavor
from pilot.xds.proxy import Unauthenticated

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
CDS_SERVICE = "envoy.service.cluster.v3.ClusterDiscoveryService"
EDS_SERVICE = "envoy.service.endpoint.v3.EndpointDiscoveryService"
SDS_SERVICE = "envoy.service.secret.v3.SecretDiscoveryService"
XDS_SERVICE_NAMES = (ADS_SERVICE, CDS_SERVICE, EDS_SERVICE, SDS_SERVICE)

StreamHandler = Callable[
    [AsyncIterator[Any], grpc.aio.ServicerContext[Any, bytes]], Awaitable[None]
]


def _identity(data: bytes) -> bytes:
    return data


def _stream_handler(shared: StreamContext, kind: StreamKind) -> grpc.RpcMethodHandler[Any, bytes]:
    async def handle(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, bytes]
    ) -> None:
        await Connection(shared, kind, context.peer()).serve(requests, context)

    # Requests arrive as bytes: the stream decodes them, so garbage is its error to report.
    return grpc.stream_stream_rpc_method_handler(
        handle, request_deserializer=_identity, response_serializer=_identity
    )


async def _check_credentials(
    shared: StreamContext, context: grpc.aio.ServicerContext[Any, bytes]
) -> None:
    """Unary calls need the same credentials as streams."""
    if shared.auth is None:
        return
    metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
    try:
        await shared.auth.credential(metadata, context.auth_context())
    except Unauthenticated as error:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(error))


def _fetch_handler(
    shared: StreamContext, type_url: str, flavor: Flavor
) -> grpc.RpcMethodHandler[Any, bytes]:
    """Unary Fetch*: one SotW answer for the names asked, from the current state."""

    async def fetch(data: bytes, context: grpc.aio.ServicerContext[Any, bytes]) -> bytes:
        admission = shared.admission
        try:
            await admission.rate.admit()
            message = intake.decode_request(data, False, admission.limits)
        except LimitExceeded as error:
            admission.hits.hit(error, f"Fetch from {context.peer()}")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
        except ProtocolError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        await _check_credentials(shared, context)
        try:
            intake.check_names(SotwStream(), message, type_url, admission.limits)
        except LimitExceeded as error:
            admission.hits.hit(error, f"Fetch from {context.peer()}")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
        request = convert.sotw_request(message, type_url)
        if request.type_url != type_url:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"this service serves {type_url}")
        stream = SotwStream()
        try:
            stream.on_request(request)
        except ProtocolError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        view = shared.pipeline.shared_view({types.CLUSTER: flavor.value})
        for response in stream.take_responses(view):
            return convert.encode(response)
        return convert.encode_empty(type_url, view.version(type_url))

    return grpc.unary_unary_rpc_method_handler(
        fetch, request_deserializer=_identity, response_serializer=_identity
    )


def _sds(shared: StreamContext) -> grpc.GenericRpcHandler[Any, bytes]:
    methods = {
        "StreamSecrets": _stream_handler(shared, StreamKind(False, types.SECRET, Flavor.ADS)),
        "DeltaSecrets": _stream_handler(shared, StreamKind(True, types.SECRET, Flavor.ADS)),
    }
    return grpc.method_handlers_generic_handler(SDS_SERVICE, methods)


def xds_handlers(shared: StreamContext) -> list[grpc.GenericRpcHandler[Any, bytes]]:
    """Generic handlers for every xDS service pilot serves."""

    def kind(delta: bool, fixed: str | None, flavor: Flavor) -> grpc.RpcMethodHandler[Any, bytes]:
        return _stream_handler(shared, StreamKind(delta, fixed, flavor))

    ads = {
        "StreamAggregatedResources": kind(False, None, Flavor.ADS),
        "DeltaAggregatedResources": kind(True, None, Flavor.ADS),
    }
    cds = {
        "StreamClusters": kind(False, types.CLUSTER, Flavor.GRPC),
        "DeltaClusters": kind(True, types.CLUSTER, Flavor.DELTA_GRPC),
        "FetchClusters": _fetch_handler(shared, types.CLUSTER, Flavor.GRPC),
    }
    eds = {
        "StreamEndpoints": kind(False, types.ENDPOINT, Flavor.GRPC),
        "DeltaEndpoints": kind(True, types.ENDPOINT, Flavor.DELTA_GRPC),
        "FetchEndpoints": _fetch_handler(shared, types.ENDPOINT, Flavor.GRPC),
    }
    handlers = [
        grpc.method_handlers_generic_handler(ADS_SERVICE, ads),
        grpc.method_handlers_generic_handler(CDS_SERVICE, cds),
        grpc.method_handlers_generic_handler(EDS_SERVICE, eds),
    ]
    if types.SECRET in shared.types:
        handlers.append(_sds(shared))
    return handlers


def xds_service_names(shared: StreamContext) -> tuple[str, ...]:
    """The xDS services `xds_handlers` registers for this context."""
    if types.SECRET in shared.types:
        return XDS_SERVICE_NAMES
    return tuple(name for name in XDS_SERVICE_NAMES if name != SDS_SERVICE)


def sds_handlers(shared: StreamContext) -> list[grpc.GenericRpcHandler[Any, bytes]]:
    """Only the SecretDiscoveryService (for `pilot agent`)."""
    return [_sds(shared)]
