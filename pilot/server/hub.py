"""The hub: every live xDS stream, who subscribes to what, and push fan-out.

The push pipeline hands the hub the names that changed per type; the hub marks
only the streams subscribed to them and wakes their writers. The hub also ties
the streams of one Envoy node together: a node that fetches clusters and
endpoints over separate (non-ADS) streams gets its assignments resent once it
has applied new clusters, since Envoy keeps a re-sent cluster warming until
its assignment arrives.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING

from pilot.protocol.messages import Acked, Nacked, StaleNonce, StreamEvent, SubscriptionChanged
from pilot.push.subscribers import SubscriberIndex
from pilot.settings import PushSettings
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import CacheView, ResourceCache
from pilot.xds.resource import Resource

if TYPE_CHECKING:
    from pilot.debug.metrics import Metrics
    from pilot.security.secrets import SecretManager
    from pilot.security.xds_auth import IdentityPolicy
    from pilot.server.connection import Connection

log = logging.getLogger("pilot.xds")


class ProxyView:
    """What one proxy's stream reads: the shared resources, and its own secrets."""

    __slots__ = ("_proxy_id", "_secrets", "_shared")

    def __init__(self, shared: CacheView, secrets: SecretManager | None, proxy_id: str) -> None:
        self._shared = shared
        self._secrets = secrets
        self._proxy_id = proxy_id

    def get(self, type_url: str, name: str) -> Resource | None:
        if type_url != types.SECRET:
            return self._shared.get(type_url, name)
        return self._secrets.get(self._proxy_id, name) if self._secrets else None

    def names(self, type_url: str) -> Collection[str]:
        if type_url != types.SECRET:
            return self._shared.names(type_url)
        return self._secrets.names(self._proxy_id) if self._secrets else ()

    def version(self, type_url: str) -> str:
        if type_url != types.SECRET:
            return self._shared.version(type_url)
        return self._secrets.version() if self._secrets else "0"

    def pending(self, type_url: str, name: str) -> bool:
        if type_url != types.SECRET or self._secrets is None:
            return False
        return self._secrets.pending(self._proxy_id, name)


class XdsHub:
    """Live connections, their subscriptions, and fan-out of changes to them."""

    def __init__(
        self,
        cache: ResourceCache,
        stats: XdsStats,
        served_types: Iterable[str],
        push: PushSettings | None = None,
    ) -> None:
        self.push_settings = push or PushSettings()
        # Bounds the responses being built and written at once, across all streams.
        self.push_slots = asyncio.Semaphore(self.push_settings.throttle)
        self.cache = cache
        self.stats = stats
        self.served_types = frozenset(served_types)
        self.connections: set[Connection] = set()
        self._subscribers: SubscriberIndex[Connection] = SubscriberIndex()
        self._by_node: dict[str, set[Connection]] = {}
        self.secrets: SecretManager | None = None
        self.identities: IdentityPolicy | None = None
        # Set once the registry has its first full state: streams answer nothing before.
        self.ready = asyncio.Event()
        self.metrics: Metrics | None = None

    def view(self, connection: Connection) -> ProxyView:
        shared = self.cache.view(connection.kind.flavor.value)
        return ProxyView(shared, self.secrets, connection.proxy_id)

    def connect(self, connection: Connection) -> None:
        self.connections.add(connection)

    def identify(self, connection: Connection) -> None:
        self._by_node.setdefault(connection.proxy_id, set()).add(connection)

    def disconnect(self, connection: Connection) -> None:
        self.connections.discard(connection)
        siblings = self._by_node.get(connection.proxy_id)
        if siblings is not None:
            siblings.discard(connection)
            if not siblings:
                del self._by_node[connection.proxy_id]
        self._subscribers.remove(connection, connection.subscriptions())
        if self.secrets is not None:
            for type_url, names in connection.subscriptions():
                if type_url == types.SECRET:
                    for name in names:
                        self.secrets.release(connection.proxy_id, name, connection.id)

    def secret_changed(self, proxy_id: str, name: str) -> None:
        """A proxy's secret was minted or rotated: push it to that proxy's streams."""
        for connection in self._by_node.get(proxy_id, ()):
            connection.notify(types.SECRET, (name,), time.monotonic())

    def close_all(self) -> None:
        """End every stream (shutdown)."""
        for connection in list(self.connections):
            connection.close()

    async def drain(self, spread: float) -> None:
        """End every stream, at random moments within `spread` seconds."""
        connections = list(self.connections)
        random.shuffle(connections)
        step = spread / len(connections) if connections else 0.0
        for connection in connections:
            connection.close()
            if step:
                await asyncio.sleep(step)

    def push(self, changes: Mapping[str, set[str]], started: float) -> int:
        """Mark changed names on the streams that watch them; returns streams woken."""
        woken: set[Connection] = set()
        for type_url in sorted(changes, key=types.push_rank):
            names = changes[type_url]
            for connection in self._subscribers.watchers(type_url, names):
                if connection.notify(type_url, names, started):
                    woken.add(connection)
        self.stats.pushes += 1
        self.stats.streams_woken += len(woken)
        return len(woken)

    def on_event(self, connection: Connection, event: StreamEvent) -> None:
        """Bookkeeping for what a request meant."""
        if isinstance(event, SubscriptionChanged):
            self._subscribers.apply(connection, event)
            if event.type_url == types.SECRET:
                self._secret_subscription(connection, event)
        elif isinstance(event, Nacked):
            self.stats.nacks[event.type_url] += 1
            log.warning(
                "proxy %s rejected %s version %s (nonce %s): %s",
                connection.proxy_id,
                types.short_name(event.type_url),
                event.rejected_version,
                event.nonce,
                event.message,
            )
        elif isinstance(event, StaleNonce):
            self.stats.stale_nonces[event.type_url] += 1
        if isinstance(event, Acked | Nacked) and event.type_url == types.CLUSTER:
            self._follow_clusters(connection)

    def _secret_subscription(self, connection: Connection, event: SubscriptionChanged) -> None:
        if self.secrets is None:
            return
        for name in event.added:
            self.secrets.want(connection.proxy_id, connection.identity, name, connection.id)
        for name in event.removed:
            self.secrets.release(connection.proxy_id, name, connection.id)

    def _follow_clusters(self, connection: Connection) -> None:
        """After a node applied clusters on a CDS-only stream, resend their assignments."""
        if connection.kind.fixed_type != types.CLUSTER:
            return  # ADS streams follow CDS with EDS themselves, in order
        clusters = connection.held(types.CLUSTER)
        for sibling in self._by_node.get(connection.proxy_id, ()):
            if sibling.kind.fixed_type == types.ENDPOINT:
                sibling.force(types.ENDPOINT, clusters)
