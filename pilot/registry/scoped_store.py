"""The store of one namespaced Istio policy kind, and the scopes a proxy reads it in.

AuthorizationPolicy and RequestAuthentication are kept alike: each object by its
ConfigKey and by namespace; every change says which namespaces' proxies to
reconsider; a proxy of a namespace reads that namespace's objects, then the root
namespace's (mesh-wide, or selecting workloads of every namespace). Each object
names its workloads alike (`spec.selector.matchLabels`: `read_selector`, `Scoped`).
What applies to a workload, and how, is each kind's own (`AuthorizationPolicies`,
`RequestAuthentications` subclass this).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

from pilot.registry.istio_config import ConfigKey, Reader
from pilot.registry.peer_authentication import ROOT_NAMESPACE, Labels

MAX_SELECTOR_LABELS = 4096  # matchLabels of one object (Istio's CRD's maxProperties)


def read_selector(reader: Reader, raw: Any) -> Labels:
    """`spec.selector`, checked: its matchLabels, sorted; () selects the whole namespace."""
    selector = reader.mapping(raw, "spec.selector", frozenset({"matchLabels"}))
    labels = selector.get("matchLabels")
    if isinstance(labels, Mapping) and len(labels) > MAX_SELECTOR_LABELS:
        raise reader.fail("spec.selector.matchLabels", f"has {len(labels)} labels")
    return reader.string_map(labels, "spec.selector.matchLabels") if labels else ()


class Scoped:
    """An object's name, namespace and selection, from its `key` and `selector`."""

    __slots__ = ()
    key: ConfigKey
    selector: Labels

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def namespace(self) -> str:
        return self.key.namespace

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.selector)


class Keyed(Protocol):
    """An object the store can hold: named by its ConfigKey."""

    @property
    def key(self) -> ConfigKey: ...


T = TypeVar("T", bound=Keyed)


class ScopedStore(Generic[T]):
    """Every object of one kind known, by key and by namespace."""

    def __init__(self, root_namespace: str = ROOT_NAMESPACE) -> None:
        self.root_namespace = root_namespace
        self._objects: dict[ConfigKey, T] = {}
        self._in: dict[str, dict[str, T]] = {}  # namespace -> name -> object

    def __len__(self) -> int:
        return len(self._objects)

    def objects(self) -> list[T]:
        return [self._objects[k] for k in sorted(self._objects)]

    def in_scope(self, namespace: str) -> Iterator[T]:
        """The objects a proxy of `namespace` reads: its namespace's, then the root's."""
        yield from self._in.get(namespace, {}).values()
        if namespace != self.root_namespace:
            yield from self._in.get(self.root_namespace, {}).values()

    def upsert(self, obj: T) -> frozenset[str]:
        """Add or change one; returns the namespaces whose proxies to reconsider."""
        if self._objects.get(obj.key) == obj:
            return frozenset()
        self._objects[obj.key] = obj
        self._in.setdefault(obj.key.namespace, {})[obj.key.name] = obj
        return frozenset({obj.key.namespace})

    def delete(self, key: ConfigKey) -> frozenset[str]:
        if self._objects.pop(key, None) is None:
            return frozenset()
        here = self._in[key.namespace]
        del here[key.name]
        if not here:
            del self._in[key.namespace]
        return frozenset({key.namespace})

    def replace_all(
        self, objects: Iterable[T], refused: Iterable[ConfigKey] = ()
    ) -> frozenset[str]:
        """Hold exactly these (a file reload), plus the last good version of each refused
        one; returns the namespaces whose proxies to reconsider."""
        wanted = {obj.key: obj for obj in objects}
        for key in refused:
            if key not in wanted and key in self._objects:
                wanted[key] = self._objects[key]
        touched = {k.namespace for k in wanted.keys() ^ self._objects.keys()}
        touched |= {k.namespace for k, obj in wanted.items() if self._objects.get(k) != obj}
        self._objects = wanted
        self._in = {}
        for key, obj in wanted.items():
            self._in.setdefault(key.namespace, {})[key.name] = obj
        return frozenset(touched)
