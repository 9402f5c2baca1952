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
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from pilot.protocol.messages import Acked, Nacked, StaleNonce, StreamEvent, SubscriptionChanged
from pilot.push.subscribers import SubscriberIndex
from pilot.settings import PushSettings
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache

if TYPE_CHECKING:
    from pilot.server.connection import Connection

log = logging.getLogger("pilot.xds")


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

    def close_all(self) -> None:
        """End every stream (shutdown)."""
        for connection in list(self.connections):
            connection.close()

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

    def _follow_clusters(self, connection: Connection) -> None:
        """After a node applied clusters on a CDS-only stream, resend their assignments."""
        if connection.kind.fixed_type != types.CLUSTER:
            return  # ADS streams follow CDS with EDS themselves, in order
        clusters = connection.held(types.CLUSTER)
        for sibling in self._by_node.get(connection.proxy_id, ()):
            if sibling.kind.fixed_type == types.ENDPOINT:
                sibling.force(types.ENDPOINT, clusters)
