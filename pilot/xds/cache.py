"""The resource cache: the current `Resource` of every name, per type, with type versions.

Clusters exist in several flavors (see `pilot.generators.cds.Flavor`); other
types have one. `update` reports which names really changed (content versions
differ), so a rebuild that produced equal bytes pushes nothing. The cache never
touches gRPC: streams read it through a `CacheView`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from pilot.xds import types
from pilot.xds.resource import Resource

DEFAULT_FLAVOR = ""

TableKey = tuple[str, str]


class ResourceCache:
    """name -> Resource per (type, flavor), and a version per type."""

    def __init__(self) -> None:
        self._tables: dict[TableKey, dict[str, Resource]] = {}
        self._versions: dict[str, int] = {}

    def update(
        self,
        type_url: str,
        upserts: Iterable[Resource],
        removals: Iterable[str] = (),
        flavor: str = DEFAULT_FLAVOR,
    ) -> set[str]:
        """Store new resources and drop removed names; returns the names that changed."""
        table = self._tables.setdefault((type_url, flavor), {})
        changed = set()
        for resource in upserts:
            old = table.get(resource.name)
            if old is None or old.version != resource.version:
                table[resource.name] = resource
                changed.add(resource.name)
        for name in removals:
            if table.pop(name, None) is not None:
                changed.add(name)
        if changed:
            self._versions[type_url] = self._versions.get(type_url, 0) + 1
        return changed

    def get(self, type_url: str, name: str, flavor: str = DEFAULT_FLAVOR) -> Resource | None:
        return self._tables.get((type_url, flavor), {}).get(name)

    def names(self, type_url: str, flavor: str = DEFAULT_FLAVOR) -> Collection[str]:
        return self._tables.get((type_url, flavor), {}).keys()

    def version(self, type_url: str) -> str:
        return str(self._versions.get(type_url, 0))

    def view(self, cluster_flavor: str = DEFAULT_FLAVOR) -> CacheView:
        return CacheView(self, cluster_flavor)


class CacheView:
    """The cache as one kind of client sees it (its cluster flavor)."""

    __slots__ = ("_cache", "_cluster_flavor")

    def __init__(self, cache: ResourceCache, cluster_flavor: str) -> None:
        self._cache = cache
        self._cluster_flavor = cluster_flavor

    def _flavor(self, type_url: str) -> str:
        return self._cluster_flavor if type_url == types.CLUSTER else DEFAULT_FLAVOR

    def get(self, type_url: str, name: str) -> Resource | None:
        return self._cache.get(type_url, name, self._flavor(type_url))

    def names(self, type_url: str) -> Collection[str]:
        return self._cache.names(type_url, self._flavor(type_url))

    def version(self, type_url: str) -> str:
        return self._cache.version(type_url)

    def pending(self, type_url: str, name: str) -> bool:
        return False
