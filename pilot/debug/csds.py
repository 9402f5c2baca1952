"""CSDS: `envoy.service.status.v3.ClientStatusDiscoveryService` (Fetch and Stream).

One `ClientConfig` per connected proxy (node id and proven identity: the
identity's SPIFFE URI is its `client_scope`), a `GenericXdsConfig` per resource it
subscribes to, filtered by `node_matchers` on the node id; resource contents
unless `exclude_resource_contents`; secrets always redacted.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.admin.v3 import config_dump_shared_pb2
from envoy.service.status.v3 import csds_pb2
from envoy.type.matcher.v3 import node_pb2, string_pb2

from pilot.debug.proxy_status import LiveProxies, ProxyStatus, ResourceStatus, Sync, packed

CSDS_SERVICE = "envoy.service.status.v3.ClientStatusDiscoveryService"

_CONFIG_STATUS = {
    Sync.SYNCED: csds_pb2.SYNCED,
    Sync.NOT_SENT: csds_pb2.NOT_SENT,
    Sync.STALE: csds_pb2.STALE,
    Sync.ERROR: csds_pb2.ERROR,
}
_CLIENT_STATUS = {
    Sync.SYNCED: config_dump_shared_pb2.ACKED,
    Sync.NOT_SENT: config_dump_shared_pb2.REQUESTED,
    Sync.STALE: config_dump_shared_pb2.REQUESTED,
    Sync.ERROR: config_dump_shared_pb2.NACKED,
}


def string_matches(matcher: string_pb2.StringMatcher, value: str) -> bool:
    """Envoy's StringMatcher (exact, prefix, suffix, contains, safe_regex)."""
    kind = matcher.WhichOneof("match_pattern")
    if matcher.ignore_case and kind != "safe_regex":
        value = value.lower()
    pattern = getattr(matcher, kind) if kind else ""
    if isinstance(pattern, str) and matcher.ignore_case:
        pattern = pattern.lower()
    if kind == "exact":
        return value == pattern
    if kind == "prefix":
        return value.startswith(pattern)
    if kind == "suffix":
        return value.endswith(pattern)
    if kind == "contains":
        return pattern in value
    if kind == "safe_regex":
        return re.fullmatch(matcher.safe_regex.regex, value) is not None
    return True


def _matches(status: ProxyStatus, matchers: list[node_pb2.NodeMatcher]) -> bool:
    if not matchers:
        return True
    return any(
        not matcher.HasField("node_id") or string_matches(matcher.node_id, status.proxy.node_id)
        for matcher in matchers
    )


def _generic(
    resource: ResourceStatus, with_contents: bool
) -> csds_pb2.ClientConfig.GenericXdsConfig:
    config = csds_pb2.ClientConfig.GenericXdsConfig(
        type_url=resource.type_url,
        name=resource.name,
        version_info=resource.version,
        config_status=_CONFIG_STATUS[resource.status],
        client_status=_CLIENT_STATUS[resource.status],
    )
    if resource.status is Sync.NOT_SENT and resource.resource is None:
        config.client_status = config_dump_shared_pb2.DOES_NOT_EXIST
    if with_contents and resource.resource is not None and resource.status is not Sync.NOT_SENT:
        config.xds_config.CopyFrom(packed(resource.resource))
    if resource.error is not None:
        config.error_state.details = resource.error
        config.error_state.version_info = resource.rejected_version
    return config


def client_status(
    proxies: LiveProxies, request: csds_pb2.ClientStatusRequest
) -> csds_pb2.ClientStatusResponse:
    """The answer to one ClientStatusRequest: one ClientConfig per proxy (node, identity)."""
    response = csds_pb2.ClientStatusResponse()
    matchers = list(request.node_matchers)
    for status in proxies.statuses():
        if not _matches(status, matchers):
            continue
        config = response.config.add()
        if status.node is not None:
            config.node.CopyFrom(status.node)
        # Two identities may claim one node id: the scope tells their rows apart.
        config.client_scope = status.proxy.identity or ""
        for resource in status.resources:
            config.generic_xds_configs.append(
                _generic(resource, not request.exclude_resource_contents)
            )
    return response


def csds_handler(proxies: LiveProxies) -> grpc.GenericRpcHandler[Any, Any]:
    async def fetch(
        request: csds_pb2.ClientStatusRequest, _context: grpc.aio.ServicerContext[Any, Any]
    ) -> csds_pb2.ClientStatusResponse:
        return client_status(proxies, request)

    async def stream(
        requests: AsyncIterator[csds_pb2.ClientStatusRequest],
        _context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[csds_pb2.ClientStatusResponse]:
        async for request in requests:
            yield client_status(proxies, request)

    serialize = csds_pb2.ClientStatusResponse.SerializeToString
    deserialize = csds_pb2.ClientStatusRequest.FromString
    methods = {
        "FetchClientStatus": grpc.unary_unary_rpc_method_handler(
            fetch, request_deserializer=deserialize, response_serializer=serialize
        ),
        "StreamClientStatus": grpc.stream_stream_rpc_method_handler(
            stream, request_deserializer=deserialize, response_serializer=serialize
        ),
    }
    return grpc.method_handlers_generic_handler(CSDS_SERVICE, methods)
