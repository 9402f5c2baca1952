"""CSDS: `envoy.service.status.v3.ClientStatusDiscoveryService` (Fetch and Stream).

One `ClientConfig` per connected proxy (node id and proven identity: the
identity's SPIFFE URI is its `client_scope`), a `GenericXdsConfig` per resource it
subscribes to, filtered by `node_matchers` on the node id (RE2, see
`node_matching`); resource contents unless `exclude_resource_contents`; secrets
always redacted. Callers authenticate as xDS streams do and see the proxies
`StatusReaders` allows them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.admin.v3 import config_dump_shared_pb2
from envoy.service.status.v3 import csds_pb2

from pilot.debug.node_matching import MatcherError, compile_node_matchers
from pilot.debug.proxy_status import LiveProxies, ResourceStatus, Sync, packed
from pilot.decoding import BadRequest, decode
from pilot.limits import Admission, LimitExceeded
from pilot.security.identity import Identity
from pilot.xds.proxy import ProxyAuthenticator, ProxyKey, Unauthenticated

log = logging.getLogger("pilot.xds")

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


@dataclass(frozen=True)
class StatusReaders:
    """Who may read which proxies' status.

    An authenticated caller sees the proxies of its own namespace (as its
    streams proved it); accounts of pilot's own namespace, and those listed in
    PILOT_CSDS_TRUSTED_ACCOUNTS (`ns/sa,...`), see every proxy. With `--xds-auth
    none` nobody proves anything and everyone sees everything.
    """

    namespace: str
    trusted_accounts: frozenset[str] = frozenset()

    def scope(self, caller: str | None) -> Callable[[ProxyKey], bool]:
        """What `caller` (a SPIFFE URI, None when unauthenticated) may see."""
        if caller is None:
            return lambda proxy: True
        identity = Identity.parse(caller)
        if identity.namespace == self.namespace or identity.account in self.trusted_accounts:
            return lambda proxy: True
        return lambda proxy: _namespace_of(proxy) == identity.namespace


def _namespace_of(proxy: ProxyKey) -> str | None:
    return Identity.parse(proxy.identity).namespace if proxy.identity else None


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
    proxies: LiveProxies,
    request: csds_pb2.ClientStatusRequest,
    visible: Callable[[ProxyKey], bool] = lambda proxy: True,
) -> csds_pb2.ClientStatusResponse:
    """The answer to one ClientStatusRequest: one ClientConfig per proxy (node, identity).

    Raises MatcherError for matchers pilot will not run.
    """
    response = csds_pb2.ClientStatusResponse()
    matches = compile_node_matchers(request.node_matchers)
    for status in proxies.statuses():
        if not visible(status.proxy) or not matches(status.proxy.node_id):
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


class _Csds:
    """The service: who is calling, what they may see, the answer."""

    def __init__(
        self,
        proxies: LiveProxies,
        auth: ProxyAuthenticator | None,
        readers: StatusReaders,
        admission: Admission,
    ) -> None:
        self._proxies = proxies
        self._auth = auth
        self._readers = readers
        self._admission = admission

    async def _admit(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        try:
            await self._admission.rate.admit()
        except LimitExceeded as error:
            self._admission.hits.hit(error, f"CSDS caller {context.peer()}")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))

    async def _scope(
        self, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Callable[[ProxyKey], bool]:
        if self._auth is None:
            return self._readers.scope(None)
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        try:
            caller = await self._auth.credential(metadata, context.auth_context())
        except Unauthenticated as error:
            log.warning("CSDS caller %s refused: %s", context.peer(), error)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(error))
        return self._readers.scope(caller)

    async def _answer(
        self,
        data: bytes,
        scope: Callable[[ProxyKey], bool],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> bytes:
        limit = self._admission.limits.request_bytes
        if len(data) > limit:
            error = LimitExceeded("request_bytes", f"a request of more than {limit} bytes")
            self._admission.hits.hit(error, f"CSDS caller {context.peer()}")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
        try:
            request = decode(csds_pb2.ClientStatusRequest, data)
            answer: bytes = client_status(self._proxies, request, scope).SerializeToString()
            return answer
        except (BadRequest, MatcherError) as error:
            log.warning("CSDS request from %s refused: %s", context.peer(), error)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))

    async def fetch(self, data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        await self._admit(context)
        return await self._answer(data, await self._scope(context), context)

    async def stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        await self._admit(context)
        scope = await self._scope(context)
        async for data in requests:
            yield await self._answer(data, scope, context)


def _identity(data: bytes) -> bytes:
    return data


def csds_handler(
    proxies: LiveProxies,
    auth: ProxyAuthenticator | None,
    readers: StatusReaders,
    admission: Admission | None = None,
) -> grpc.GenericRpcHandler[Any, Any]:
    """FetchClientStatus and StreamClientStatus; callers authenticate as xDS streams do."""
    service = _Csds(proxies, auth, readers, admission or Admission.unlimited())
    methods = {
        "FetchClientStatus": grpc.unary_unary_rpc_method_handler(
            service.fetch, request_deserializer=_identity, response_serializer=_identity
        ),
        "StreamClientStatus": grpc.stream_stream_rpc_method_handler(
            service.stream, request_deserializer=_identity, response_serializer=_identity
        ),
    }
    return grpc.method_handlers_generic_handler(CSDS_SERVICE, methods)
