"""The resource cache: the current `Resource` of every name, and what each stream may read.

Resources live in tables by (type, flavor, owner). Some types exist once per
flavor: clusters per way of fetching them (see `pilot.xds.flavor`), endpoint
assignments per proxy locality (see `pilot.xds.locality`); a stream's view
names the flavor it reads of each type (`Flavors`), every other type is read
from its one shared table (flavor `SHARED`). Shared resources are shared, except
that resources of `OWNED_TYPES` (workload secrets) may belong to one proxy
(`ProxyKey`): they sit in that proxy's table and only its streams see them.
`update` reports which names really changed (content versions differ), so a
rebuild that produced equal bytes pushes nothing; each type has one version
that rises with every change, whatever table it is in. A name can be marked
*pending* for an owner while it is being made (a certificate being minted).

A proxy may also read an *overlay* of a type (`set_overlay`): another shared
table (its inbound listener and clusters, `pilot.generators.inbound_proxies`),
whose names join the wildcard set of that type for that proxy's streams only
(those that read the flavors the overlay asks for), and win over the flavor's
own. Overlay tables are shared too (one per inbound shape, built once, read by
every proxy of that shape). A proxy with no overlay reads exactly as before:
its lookups go straight to the shared table. Overlays come in *layers* (one per
generator that lays them: a sidecar's inbound clusters and its namespace's own
outbound ones, `pilot.generators.client_clusters`), looked up in layer order; an
overlay table may also *hide* shared names (`hide`: a subset cluster the shared
DestinationRule has and the one a namespace follows does not) from its readers.

Streams read the cache through a `ProxyView`. The cache never touches gRPC.

The cache also keeps, per type and per table a stream reads (flavor and
overlay), a small memo of *first answers* (`first_answers`): what a stream
that holds nothing yet is owed for one subscription, worked out once and read
by every stream that subscribes alike (a restart's thousand Envoys ask for the
same clusters and assignments). A memo lives while what its type's tables hold
does: any change to them starts it afresh, while an overlay laid over one
proxy's view, which changes no table, does not. Resources that belong to one
proxy get none.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from pilot.xds import types
from pilot.xds.proxy import ProxyKey
from pilot.xds.resource import Resource

SHARED = ""
# First answers remembered per type at once: subscriptions, and the names they cover
# (a name costs a version entry and a reference, ~100 B).
MAX_FIRST_ANSWERS = 64
MAX_FIRST_ANSWER_NAMES = 50_000
_EMPTY: Mapping[str, Resource] = {}

TableKey = tuple[str, str, ProxyKey | None]
Flavors = Mapping[str, str]  # type URL -> the flavor a stream reads (absent: SHARED)
NO_FLAVORS: Flavors = {}
# (the flavor of the overlay table, the (type, flavor)s a stream must read).
Overlay = tuple[str, tuple[tuple[str, str], ...]]
Layered = tuple[tuple[str, Overlay], ...]  # (layer, overlay), in layer order
Overlays = Mapping[str, Layered]  # type URL -> its overlays
Laid = tuple[tuple[str, Mapping[str, Resource], frozenset[str]], ...]  # (flavor, table, hidden)
_NONE_HIDDEN: frozenset[str] = frozenset()


class ResourceCache:
    """(type, flavor, owner) -> name -> Resource, and a version per type."""

    def __init__(self) -> None:
        self._tables: dict[TableKey, dict[str, Resource]] = {}
        self._versions: dict[str, int] = {}
        # Per type, a count of changes to its tables' contents: overlays laid or lifted
        # change what one proxy reads, not what a table holds, so they leave it as it is.
        self._contents: dict[str, int] = {}
        self._pending: set[tuple[str, ProxyKey, str]] = set()
        self._overlays: dict[ProxyKey, dict[str, Layered]] = {}
        self._hidden: dict[tuple[str, str], frozenset[str]] = {}
        self._answers: dict[str, AnswerMemo] = {}

    def update(
        self,
        type_url: str,
        upserts: Iterable[Resource],
        removals: Iterable[str] = (),
        *,
        flavor: str = SHARED,
        owner: ProxyKey | None = None,
    ) -> set[str]:
        """Store new resources and drop removed names; returns the names that changed."""
        key = (type_url, flavor, owner)
        table = self._tables.setdefault(key, {})
        changed = set()
        for resource in upserts:
            old = table.get(resource.name)
            if old is None or old.version != resource.version:
                table[resource.name] = resource
                changed.add(resource.name)
        for name in removals:
            if table.pop(name, None) is not None:
                changed.add(name)
        if owner is not None:
            self._pending.difference_update((type_url, owner, n) for n in changed)
            if not table:
                del self._tables[key]  # owners come and go: keep no empty tables
        if changed:
            self._versions[type_url] = self._versions.get(type_url, 0) + 1
            self._contents[type_url] = self._contents.get(type_url, 0) + 1
        return changed

    def get(
        self, type_url: str, name: str, *, flavor: str = SHARED, owner: ProxyKey | None = None
    ) -> Resource | None:
        table = self._tables.get((type_url, flavor, owner))
        return table.get(name) if table is not None else None

    def shared_table(self, type_url: str, flavor: str = SHARED) -> Mapping[str, Resource]:
        """Every shared resource of a type in a flavor, by name (read-only for callers)."""
        return self._tables.get((type_url, flavor, None), _EMPTY)

    def names(self, type_url: str, *, flavor: str = SHARED) -> Collection[str]:
        """The shared names of a type."""
        return self._tables.get((type_url, flavor, None), {}).keys()

    def version(self, type_url: str) -> str:
        return str(self._versions.get(type_url, 0))

    def drop_flavor(self, type_url: str, flavor: str) -> None:
        """Forget every shared resource of a flavor no stream reads any more."""
        if flavor == SHARED:
            return
        hid = self._hidden.pop((type_url, flavor), None) is not None
        if self._tables.pop((type_url, flavor, None), None) is not None or hid:
            self._contents[type_url] = self._contents.get(type_url, 0) + 1

    def hide(self, type_url: str, flavor: str, names: Collection[str]) -> set[str]:
        """Make overlay table `flavor` hide `names` of the shared table from its readers
        (replacing what it hid); returns the names whose visibility changed."""
        key = (type_url, flavor)
        old, new = self._hidden.get(key, _NONE_HIDDEN), frozenset(names)
        if old == new:
            return set()
        if new:
            self._hidden[key] = new
        else:
            del self._hidden[key]
        self._versions[type_url] = self._versions.get(type_url, 0) + 1
        self._contents[type_url] = self._contents.get(type_url, 0) + 1
        return set(old ^ new)

    def hidden(self, type_url: str, flavor: str) -> frozenset[str]:
        """The shared names overlay table `flavor` hides from its readers."""
        return self._hidden.get((type_url, flavor), _NONE_HIDDEN)

    def set_pending(self, type_url: str, name: str, owner: ProxyKey, pending: bool) -> None:
        """Mark (or unmark) an owner's resource as being made: not absent, not there yet."""
        if pending:
            self._pending.add((type_url, owner, name))
        else:
            self._pending.discard((type_url, owner, name))

    def pending(self, type_url: str, name: str, owner: ProxyKey) -> bool:
        return (type_url, owner, name) in self._pending

    def set_overlay(
        self,
        owner: ProxyKey,
        type_url: str,
        overlay: str | None,
        when: Flavors = NO_FLAVORS,
        *,
        layer: str = "",
    ) -> bool:
        """Lay the shared table `overlay` of a type, as `layer`, over what `owner`'s streams
        read of it, on those streams that read every flavor `when` names (type -> flavor);
        None takes that layer away. Returns whether that changed anything.

        The type's version rises: what the owner's streams hold is another set now.
        """
        mine = self._overlays.setdefault(owner, {})
        layers = dict(mine.get(type_url, ()))
        laid = (overlay, tuple(sorted(when.items()))) if overlay is not None else None
        if layers.get(layer) == laid:
            if not mine:
                del self._overlays[owner]
            return False
        if laid is None:
            del layers[layer]
        else:
            layers[layer] = laid
        if layers:
            mine[type_url] = tuple(sorted(layers.items()))
        else:
            del mine[type_url]
        if not mine:
            del self._overlays[owner]
        self._versions[type_url] = self._versions.get(type_url, 0) + 1
        return True

    def first_answers(self, type_url: str, table: Hashable) -> FirstAnswers:
        """The memo of first answers for streams that read `table` of a type, while its
        tables hold what they hold now (a proxy's overlay coming or going changes none)."""
        version = self._contents.get(type_url, 0)
        memo = self._answers.get(type_url)
        if memo is None or memo.version != version:
            memo = self._answers[type_url] = AnswerMemo(version)
        return FirstAnswers(memo, table)

    def overlays_of(self, owner: ProxyKey | None) -> Overlays | None:
        """The overlays an owner's streams read (None: none, the common case)."""
        return self._overlays.get(owner) if owner is not None else None

    def view(self, flavors: Flavors = NO_FLAVORS, owner: ProxyKey | None = None) -> ProxyView:
        """What a stream reading these flavors, speaking for `owner`, may read."""
        return ProxyView(self, flavors, owner)


class ProxyView:
    """The cache as one stream sees it: shared resources in its flavor, then its own.

    Resources of `OWNED_TYPES` are looked up in the owner's table first, then
    among the shared ones (the trust root). A view never sees another owner's.
    An overlay the owner reads over a type's flavor comes before that flavor.
    """

    __slots__ = ("_cache", "_flavors", "_overlays", "_owner")

    def __init__(self, cache: ResourceCache, flavors: Flavors, owner: ProxyKey | None) -> None:
        self._cache = cache
        self._flavors = flavors
        self._owner = owner
        self._overlays = cache.overlays_of(owner)

    def _shared_flavor(self, type_url: str) -> str:
        return self._flavors.get(type_url, SHARED)

    def _laid(self, type_url: str) -> Laid:
        """The overlays this stream reads over a type, in layer order (most read none)."""
        if self._overlays is None:
            return ()
        layered = self._overlays.get(type_url)
        if not layered:
            return ()
        cache, flavors, laid = self._cache, self._flavors, []
        for _layer, (flavor, when) in layered:
            for type_asked, flavor_asked in when:
                if flavors.get(type_asked, SHARED) != flavor_asked:
                    break
            else:
                table = cache.shared_table(type_url, flavor)
                laid.append((flavor, table, cache.hidden(type_url, flavor)))
        return tuple(laid)

    def get(self, type_url: str, name: str) -> Resource | None:
        if type_url in types.OWNED_TYPES and self._owner is not None:
            own = self._cache.get(type_url, name, owner=self._owner)
            if own is not None:
                return own
        laid = self._laid(type_url)
        if laid:
            return _through(
                laid, name, self._cache.shared_table(type_url, self._shared_flavor(type_url)).get
            )
        return self._cache.get(type_url, name, flavor=self._shared_flavor(type_url))

    def lookup(self, type_url: str) -> Callable[[str], Resource | None]:
        """`get` for one type: straight from the shared table, unless the type has owners
        or this proxy reads an overlay over it."""
        if type_url in types.OWNED_TYPES and self._owner is not None:
            return functools.partial(self.get, type_url)
        shared = self._cache.shared_table(type_url, self._shared_flavor(type_url)).get
        laid = self._laid(type_url)
        if not laid:
            return shared
        if len(laid) == 1 and not laid[0][2]:
            # The common overlay (a sidecar's inbound clusters): one table, hiding nothing.
            laid_get = laid[0][1].get

            def either(name: str) -> Resource | None:
                found = laid_get(name)
                return found if found is not None else shared(name)

            return either
        return functools.partial(_through, laid, shared=shared)

    def names(self, type_url: str) -> Collection[str]:
        """The shared names of a type (what a wildcard subscription holds), less those the
        overlays this proxy reads over it hide, and the names of those overlays."""
        shared = self._cache.names(type_url, flavor=self._shared_flavor(type_url))
        laid = self._laid(type_url)
        if not laid:
            return shared
        names = set(shared).difference(*(hidden for _, _, hidden in laid))
        return names.union(*(table.keys() for _, table, _ in laid))

    def version(self, type_url: str) -> str:
        return self._cache.version(type_url)

    def pending(self, type_url: str, name: str) -> bool:
        return self._owner is not None and self._cache.pending(type_url, name, self._owner)

    def first_answers(self, type_url: str) -> FirstAnswers | None:
        """The memo of first answers shared by streams that read what this one reads of a
        type (None: a type whose resources may be this proxy's own)."""
        if type_url in types.OWNED_TYPES:
            return None
        overlays = tuple(flavor for flavor, _, _ in self._laid(type_url))
        return self._cache.first_answers(type_url, (self._shared_flavor(type_url), overlays))


def _through(laid: Laid, name: str, shared: Callable[[str], Resource | None]) -> Resource | None:
    """`name` in the first overlay that has it, else the shared one unless one hides it."""
    for _, table, _ in laid:
        found = table.get(name)
        if found is not None:
            return found
    for _, _, hidden in laid:
        if name in hidden:
            return None
    return shared(name)


class FirstAnswers:
    """One table's part of a type's memo of first answers (`ResourceCache.first_answers`)."""

    __slots__ = ("_memo", "_table")

    def __init__(self, memo: AnswerMemo, table: Hashable) -> None:
        self._memo = memo
        self._table = table

    def get(self, key: Hashable) -> object | None:
        return self._memo.answers.get((self._table, key))

    def put(self, key: Hashable, answer: object, names: int) -> None:
        """Remember an answer that covers `names` names, while the memo has room."""
        memo = self._memo
        if memo.names + names > MAX_FIRST_ANSWER_NAMES or len(memo.answers) >= MAX_FIRST_ANSWERS:
            return  # full: later streams work their answers out, as without a memo
        memo.answers[(self._table, key)] = answer
        memo.names += names


@dataclass(slots=True)
class AnswerMemo:
    """A type's first answers while its tables hold what they hold (`version` counts
    changes to them), and how many names the answers cover.

    The keys are (table, subscription): what `FirstAnswers` puts.
    """

    version: int
    answers: dict[Hashable, object] = field(default_factory=dict)
    names: int = 0
