"""Which streams watch which names, and which streams make up each proxy.

The reverse index that makes fan-out cheap: a change to one shared name
touches only the streams that subscribe to it (or to the whole type), and a
change to one proxy's own resource (its certificate) only that proxy's
streams, never every connected stream.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Generic, Protocol, TypeVar

from pilot.protocol.messages import SubscriptionChanged
from pilot.xds.proxy import ProxyKey


class Watcher(Protocol):
    """A stream, as the index sees it: who it speaks for."""

    @property
    def proxy(self) -> ProxyKey: ...


W = TypeVar("W", bound=Watcher)


class SubscriberIndex(Generic[W]):
    """(type, name) -> watchers, type -> wildcard watchers, and proxy -> its streams."""

    def __init__(self) -> None:
        self._by_name: dict[str, dict[str, set[W]]] = {}
        self._wildcard: dict[str, set[W]] = {}
        self._by_proxy: dict[ProxyKey, set[W]] = {}

    def join(self, watcher: W) -> None:
        """A stream identified its proxy."""
        self._by_proxy.setdefault(watcher.proxy, set()).add(watcher)

    def leave(self, watcher: W, subscriptions: Iterable[tuple[str, Iterable[str]]]) -> None:
        """Forget a stream that ended: its (type, names) pairs, wildcards, and proxy."""
        for type_url, names in subscriptions:
            by_name = self._by_name.get(type_url, {})
            for name in names:
                self._discard(by_name, name, watcher)
            self._wildcard.get(type_url, set()).discard(watcher)
        streams = self._by_proxy.get(watcher.proxy)
        if streams is not None:
            streams.discard(watcher)
            if not streams:
                del self._by_proxy[watcher.proxy]

    def apply(self, watcher: W, event: SubscriptionChanged) -> None:
        """Record one stream's subscription change."""
        names = self._by_name.setdefault(event.type_url, {})
        for name in event.added:
            names.setdefault(name, set()).add(watcher)
        for name in event.removed:
            self._discard(names, name, watcher)
        wildcard = self._wildcard.setdefault(event.type_url, set())
        if event.wildcard:
            wildcard.add(watcher)
        else:
            wildcard.discard(watcher)

    def watchers(self, type_url: str, names: Iterable[str]) -> set[W]:
        """Streams that care about any of these shared names of this type."""
        found = set(self._wildcard.get(type_url, ()))
        by_name = self._by_name.get(type_url, {})
        for name in names:
            found |= by_name.get(name, set())
        return found

    def streams_of(self, proxy: ProxyKey) -> Collection[W]:
        """Every stream of one proxy (same node id, same proven identity)."""
        return self._by_proxy.get(proxy, set())

    def proxy_watchers(self, proxy: ProxyKey, type_url: str, name: str) -> int:
        """How many streams of `proxy` subscribe to `name` by name."""
        holders = self._by_name.get(type_url, {}).get(name)
        if not holders:
            return 0
        return sum(1 for stream in self._by_proxy.get(proxy, ()) if stream in holders)

    @staticmethod
    def _discard(by_name: dict[str, set[W]], name: str, watcher: W) -> None:
        holders = by_name.get(name)
        if holders is not None:
            holders.discard(watcher)
            if not holders:
                del by_name[name]
