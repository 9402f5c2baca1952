"""Which streams watch which names, and which streams make up each proxy.

The reverse index that makes fan-out cheap: a change to one shared name
touches only the streams that subscribe to it (or to the whole type), and a
change to one proxy's own resource (its certificate) only that proxy's
streams, never every connected stream.

Streams are indexed by the set of names they subscribe to, not name by name:
streams of one mesh subscribe alike (one `SharedNames` for all of them), so
the names of a set are indexed once, when its first stream arrives, and each
further stream with that set costs one set insertion to join and to leave,
however many names it holds.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Set
from typing import Generic, Protocol, TypeVar

from pilot.xds.proxy import ProxyKey


class Watcher(Protocol):
    """A stream, as the index sees it: who it speaks for."""

    @property
    def proxy(self) -> ProxyKey: ...


W = TypeVar("W", bound=Watcher)
_NONE: frozenset[str] = frozenset()


class _Group(Generic[W]):
    """The streams that subscribe to exactly one set of names of one type."""

    __slots__ = ("names", "watchers")

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.watchers: set[W] = set()


class SubscriberIndex(Generic[W]):
    """(type, name) -> groups of watchers, type -> wildcard watchers, proxy -> its streams.

    A stream that leaves a set no other stream holds keeps that set's group as its
    *spare* (indexed, holding nobody); its next set of its own is made from the
    spare by the names that differ. So a stream changing its names costs what its
    requests name, never the size of its subscription: a client flipping one name
    in and out of a 10,000-name set makes no 10,000-name index entries each time.
    """

    def __init__(self) -> None:
        self._groups: dict[str, dict[frozenset[str], _Group[W]]] = {}
        self._by_name: dict[str, dict[str, set[_Group[W]]]] = {}
        self._member: dict[tuple[W, str], _Group[W]] = {}
        self._spare: dict[tuple[W, str], _Group[W]] = {}
        self._wildcard: dict[str, set[W]] = {}
        self._by_proxy: dict[ProxyKey, set[W]] = {}

    def join(self, watcher: W) -> None:
        """A stream identified its proxy."""
        self._by_proxy.setdefault(watcher.proxy, set()).add(watcher)

    def leave(self, watcher: W, type_urls: Collection[str]) -> None:
        """Forget a stream that ended: its names and wildcards of these types, and its proxy."""
        for type_url in type_urls:
            self._move(watcher, type_url, _NONE)
            spare = self._spare.pop((watcher, type_url), None)
            if spare is not None:
                self._unindex(type_url, spare.names, spare)
            self._wildcard.get(type_url, set()).discard(watcher)
        streams = self._by_proxy.get(watcher.proxy)
        if streams is not None:
            streams.discard(watcher)
            if not streams:
                del self._by_proxy[watcher.proxy]

    def apply(self, watcher: W, type_url: str, names: frozenset[str], wildcard: bool) -> None:
        """Record one stream's subscription to one type as it now stands."""
        self._move(watcher, type_url, names)
        subscribed = self._wildcard.setdefault(type_url, set())
        if wildcard:
            subscribed.add(watcher)
        else:
            subscribed.discard(watcher)

    def watchers(self, type_url: str, names: Collection[str]) -> set[W]:
        """Streams that care about any of these shared names of this type."""
        found = set(self._wildcard.get(type_url, ()))
        by_name = self._by_name.get(type_url, {})
        for name in names:
            for group in by_name.get(name, ()):
                found |= group.watchers
        return found

    def names_of(self, watcher: W, type_url: str) -> Set[str]:
        """The names a stream subscribes to by name (as the index last heard)."""
        group = self._member.get((watcher, type_url))
        return group.names if group is not None else _NONE

    def streams_of(self, proxy: ProxyKey) -> Collection[W]:
        """Every stream of one proxy (same node id, same proven identity)."""
        return self._by_proxy.get(proxy, set())

    def proxy_watchers(self, proxy: ProxyKey, type_url: str, name: str) -> int:
        """How many streams of `proxy` subscribe to `name` by name."""
        streams = self._by_proxy.get(proxy, ())
        return sum(1 for stream in streams if name in self.names_of(stream, type_url))

    def _move(self, watcher: W, type_url: str, names: frozenset[str]) -> None:
        """Put a stream in the group of `names` (empty: in none)."""
        key = (watcher, type_url)
        old = self._member.pop(key, None)
        if old is not None and (old.names is names or old.names == names):
            self._member[key] = old
            return
        if old is not None:
            old.watchers.discard(watcher)
            if not old.watchers:
                del self._groups[type_url][old.names]
                self._keep_spare(key, old)
        if names:
            group = self._groups.setdefault(type_url, {}).get(names)
            if group is None:
                group = self._own_group(key, names)
            group.watchers.add(watcher)
            self._member[key] = group

    def _keep_spare(self, key: tuple[W, str], group: _Group[W]) -> None:
        """A group its last stream left becomes that stream's spare (one at most)."""
        older = self._spare.pop(key, None)
        if older is not None:
            self._unindex(key[1], older.names, older)
        self._spare[key] = group

    def _own_group(self, key: tuple[W, str], names: frozenset[str]) -> _Group[W]:
        """A new group for a set no stream holds: the stream's spare, changed, if it has one."""
        type_url = key[1]
        group = self._spare.pop(key, None)
        if group is None:
            group = _Group(names)
            self._index(type_url, names, group)
        else:
            self._unindex(type_url, group.names - names, group)
            self._index(type_url, names - group.names, group)
            group.names = names
        self._groups[type_url][names] = group
        return group

    def _index(self, type_url: str, names: Iterable[str], group: _Group[W]) -> None:
        by_name = self._by_name.setdefault(type_url, {})
        for name in names:
            by_name.setdefault(name, set()).add(group)

    def _unindex(self, type_url: str, names: Iterable[str], group: _Group[W]) -> None:
        by_name = self._by_name.get(type_url, {})
        for name in names:
            holders = by_name.get(name)
            if holders is not None:
                holders.discard(group)
                if not holders:
                    del by_name[name]
