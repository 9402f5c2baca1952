"""What each connected proxy holds, per resource: the model behind CSDS and /debug.

For every resource a proxy's streams subscribe to (or hold through a wildcard):
SYNCED (sent and ACKed), STALE (sent, not yet answered), NOT_SENT (asked for,
not sent: it may not exist), ERROR (NACKed, with the client's message). Secret
contents are redacted: a private key never leaves `pilot.security`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from google.protobuf import any_pb2

from pilot.protocol.stream import TypeState
from pilot.server.connection import Connection
from pilot.server.hub import ProxyView, XdsHub
from pilot.xds import types
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
    """A proxy (Envoy node id) and what all its streams hold."""

    proxy_id: str
    node: base_pb2.Node | None
    streams: tuple[str, ...]
    resources: tuple[ResourceStatus, ...]

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
    if sent.nonce_seq <= state.acked_seq:
        return ResourceStatus(state.type_url, name, sent.version, Sync.SYNCED, resource)
    nack = state.nack
    if nack is not None and int(nack.nonce) >= sent.nonce_seq:
        return ResourceStatus(
            state.type_url,
            name,
            sent.version,
            Sync.ERROR,
            resource,
            nack.message,
            nack.rejected_version,
        )
    return ResourceStatus(state.type_url, name, sent.version, Sync.STALE, resource)


def _connection_resources(hub: XdsHub, connection: Connection) -> Iterable[ResourceStatus]:
    view = hub.view(connection)
    for type_url in sorted(connection.stream.type_urls(), key=types.push_rank):
        state = connection.stream.state(type_url)
        if state is not None and type_url in hub.served_types:
            for name in _names(state, view):
                yield _status(state, name, view)


def proxy_statuses(hub: XdsHub) -> list[ProxyStatus]:
    """Every connected proxy, sorted by id."""
    grouped: dict[str, list[Connection]] = {}
    for connection in hub.connections:
        if connection.node is not None:
            grouped.setdefault(connection.proxy_id, []).append(connection)
    statuses = []
    for proxy_id in sorted(grouped):
        connections = sorted(grouped[proxy_id], key=lambda c: c.id)
        resources = [r for c in connections for r in _connection_resources(hub, c)]
        statuses.append(
            ProxyStatus(
                proxy_id,
                connections[0].node,
                tuple(c.kind.label for c in connections),
                tuple(resources),
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
