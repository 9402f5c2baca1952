"""Protobuf requests in, protocol values out; protocol responses in, wire bytes out."""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from types import MappingProxyType

from envoy.service.discovery.v3 import discovery_pb2

from pilot.protocol.messages import (
    DeltaRequest,
    DeltaResponse,
    SotwRequest,
    SotwResponse,
    Wire,
)
from pilot.xds.resource import encode_delta_response, encode_sotw_response


def _error_message(
    message: discovery_pb2.DiscoveryRequest | discovery_pb2.DeltaDiscoveryRequest,
) -> str | None:
    if not message.HasField("error_detail"):
        return None
    detail = message.error_detail
    return detail.message or f"rejected with code {detail.code}"


def _interned(names: Collection[str]) -> tuple[str, ...]:
    """Thousands of streams name the same resources: let them share one string each."""
    return tuple(map(sys.intern, names)) if names else ()


_NO_VERSIONS: Mapping[str, str] = MappingProxyType({})


def _versions(initial: Mapping[str, str]) -> Mapping[str, str]:
    """A reconnecting client's versions; an ACK has none, and shares one empty mapping."""
    return dict(initial) if initial else _NO_VERSIONS


def sotw_request(message: discovery_pb2.DiscoveryRequest, default_type: str) -> SotwRequest:
    """A DiscoveryRequest; standalone services may leave type_url implicit."""
    return SotwRequest(
        type_url=message.type_url or default_type,
        resource_names=_interned(message.resource_names),
        version_info=message.version_info,
        response_nonce=message.response_nonce,
        error_message=_error_message(message),
    )


def delta_request(message: discovery_pb2.DeltaDiscoveryRequest, default_type: str) -> DeltaRequest:
    """A DeltaDiscoveryRequest."""
    return DeltaRequest(
        type_url=message.type_url or default_type,
        subscribe=_interned(message.resource_names_subscribe),
        unsubscribe=_interned(message.resource_names_unsubscribe),
        initial_resource_versions=_versions(message.initial_resource_versions),
        response_nonce=message.response_nonce,
        error_message=_error_message(message),
    )


def encode(response: SotwResponse | DeltaResponse) -> bytes:
    """The wire bytes of a response, assembled from pre-encoded resources."""
    if response.wire is None:
        return _encoded(response)
    if isinstance(response, SotwResponse):
        key = (response.version_info, response.nonce, -1)
    else:
        key = (response.system_version_info, response.nonce, len(response.removed))
    return _shared_encoding(response, response.wire, key)


def _shared_encoding(
    response: SotwResponse | DeltaResponse,
    wire: Wire,
    key: tuple[str, str, int],
) -> bytes:
    """A shared answer's bytes: made once per (version, nonce, removals) in a row.

    Only the last is kept: the bytes are as large as the answer, and streams that
    asked alike come with the same nonce one after another.
    """
    data = wire.get(key)
    if data is None:
        data = _encoded(response)
        wire.clear()
        wire[key] = data
    return data


def _encoded(response: SotwResponse | DeltaResponse) -> bytes:
    if isinstance(response, SotwResponse):
        return encode_sotw_response(
            response.type_url, response.version_info, response.nonce, response.resources
        )
    return encode_delta_response(
        response.type_url,
        response.system_version_info,
        response.nonce,
        response.resources,
        response.removed,
    )


def encode_empty(type_url: str, version_info: str) -> bytes:
    """A DiscoveryResponse with no resources (a Fetch for names that do not exist)."""
    return encode_sotw_response(type_url, version_info, "", ())
