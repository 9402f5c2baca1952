"""Which streams watch which names: the reverse index that makes fan-out cheap.

A change to one name touches only the streams that subscribe to it (or to the
whole type), not every connected stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from pilot.protocol.messages import SubscriptionChanged

W = TypeVar("W")


class SubscriberIndex(Generic[W]):
    """(type, name) -> watchers, and type -> wildcard watchers."""

    def __init__(self) -> None:
        self._by_name: dict[str, dict[str, set[W]]] = {}
        self._wildcard: dict[str, set[W]] = {}

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

    def remove(self, watcher: W, subscriptions: Iterable[tuple[str, Iterable[str]]]) -> None:
        """Forget a stream that ended: its (type, names) pairs and wildcards."""
        for type_url, names in subscriptions:
            by_name = self._by_name.get(type_url, {})
            for name in names:
                self._discard(by_name, name, watcher)
            self._wildcard.get(type_url, set()).discard(watcher)

    def watchers(self, type_url: str, names: Iterable[str]) -> set[W]:
        """Streams that care about any of `names` of this type."""
        found = set(self._wildcard.get(type_url, ()))
        by_name = self._by_name.get(type_url, {})
        for name in names:
            found |= by_name.get(name, set())
        return found

    @staticmethod
    def _discard(by_name: dict[str, set[W]], name: str, watcher: W) -> None:
        holders = by_name.get(name)
        if holders is not None:
            holders.discard(watcher)
            if not holders:
                del by_name[name]
