"""What each connected proxy holds, per resource: the model behind CSDS and /debug.

For every resource a proxy's streams subscribe to (or hold through a wildcard):
SYNCED (sent and ACKed), STALE (sent, not yet answered), NOT_SENT (asked for,
not sent: it may not exist), ERROR (NACKed, with the client's message). A
proxy is a node id *and* the identity its streams proved: two identities
claiming one node id are two proxies, two rows. Secret contents are redacted:
a private key never leaves pilot.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from google.protobuf import any_pb2

from pilot.protocol.stream import TypeState
from pilot.push.pipeline import flavors_of
from pilot.server.connection import Connection
from pilot.xds import types
from pilot.xds.cache import ProxyView, ResourceCache
from pilot.xds.proxy import ProxyKey
from pilot.xds.resource import Resource

REDACTED = "[redacted]"


class Sync(StrEnum):
    """CSDS ConfigStatus names."""

    SYNCED = "SYNCED"
    NOT_SENT = "NOT_SENT"
    STALE = "STALE"
    ERROR = "ERROR"


@dataclass(frozen=True, slots=True)
class ResourceStatus:
    """One resource as one proxy holds it."""

    type_url: str
    name: str
    version: str
    status: Sync
    resource: Resource | None
    error: str | None = None
    rejected_version: str = ""


@dataclass(frozen=True, slots=True)
class ProxyStatus:
    """A proxy (node id and proven identity) and what all its streams hold."""

    proxy: ProxyKey
    node: base_pb2.Node | None
    streams: tuple[str, ...]
    resources: tuple[ResourceStatus, ...]
    connection_ids: tuple[int, ...] = ()  # as in /debug/connections, one per stream

    def by_type(self, type_url: str) -> list[ResourceStatus]:
        return [r for r in self.resources if r.type_url == type_url]


def _names(state: TypeState, view: ProxyView) -> list[str]:
    names = set(state.subscription.names) | state.sent.keys()
    if state.subscription.wildcard:
        names |= set(view.names(state.type_url))
    return sorted(names)


def _status(state: TypeState, name: str, view: ProxyView) -> ResourceStatus:
    resource = view.get(state.type_url, name)
    sent = state.sent.get(name)
    if sent is None:
        version = resource.version if resource else ""
        return ResourceStatus(state.type_url, name, version, Sync.NOT_SENT, resource)
    if state.sent_seq(name):  # carried by a response the client has not answered yet
        return ResourceStatus(state.type_url, name, sent, Sync.STALE, resource)
    nack = state.rejected.get(name)
    if nack is not None:
        return ResourceStatus(
            state.type_url,
            name,
            sent,
            Sync.ERROR,
            resource,
            nack.message,
            nack.rejected_version,
        )
    return ResourceStatus(state.type_url, name, sent, Sync.SYNCED, resource)


def _connection_resources(cache: ResourceCache, connection: Connection) -> Iterable[ResourceStatus]:
    view = cache.view(flavors_of(connection), connection.proxy)
    for type_url in sorted(connection.stream.type_urls(), key=types.push_rank):
        state = connection.stream.state(type_url)
        if state is not None:
            for name in _names(state, view):
                yield _status(state, name, view)


def _sort_key(proxy: ProxyKey) -> tuple[str, str]:
    return proxy.node_id, proxy.identity or ""


@dataclass(frozen=True)
class LiveProxies:
    """The live streams and the cache they read: what CSDS and /debug look at."""

    connections: Iterable[Connection]
    cache: ResourceCache

    def statuses(self, limit: int | None = None) -> list[ProxyStatus]:
        """Every connected proxy (the first `limit`), sorted by node id, then identity."""
        return proxy_statuses(self.connections, self.cache, limit)

    def count(self) -> int:
        """How many proxies are connected (identified streams, grouped by proxy)."""
        return len(_by_proxy(self.connections))


def _by_proxy(connections: Iterable[Connection]) -> dict[ProxyKey, list[Connection]]:
    grouped: dict[ProxyKey, list[Connection]] = {}
    for connection in connections:
        if connection.node is not None:
            grouped.setdefault(connection.proxy, []).append(connection)
    return grouped


def proxy_statuses(
    connections: Iterable[Connection], cache: ResourceCache, limit: int | None = None
) -> list[ProxyStatus]:
    """Every connected proxy (the first `limit`), sorted by node id, then identity."""
    grouped = _by_proxy(connections)
    statuses = []
    for proxy in sorted(grouped, key=_sort_key)[:limit]:
        streams = sorted(grouped[proxy], key=lambda c: c.id)
        resources = [r for c in streams for r in _connection_resources(cache, c)]
        statuses.append(
            ProxyStatus(
                proxy,
                streams[0].node,
                tuple(c.kind.label for c in streams),
                tuple(resources),
                tuple(c.id for c in streams),
            )
        )
    return statuses


def packed(resource: Resource) -> any_pb2.Any:
    """The resource as an Any, with private keys redacted."""
    if resource.type_url != types.SECRET:
        return any_pb2.Any(type_url=resource.type_url, value=resource.payload)
    secret = secret_pb2.Secret.FromString(resource.payload)
    if secret.HasField("tls_certificate"):
        secret.tls_certificate.private_key.Clear()
        secret.tls_certificate.private_key.inline_string = REDACTED
    return any_pb2.Any(type_url=resource.type_url, value=secret.SerializeToString())
