"""Which names of one type a stream wants: explicit names, wildcard, legacy wildcard.

Rules (xDS protocol, "How the client specifies what resources to return"):
- SotW: the first request of a type with no names is a legacy wildcard, kept as
  long as the client keeps sending no names. `*` is an explicit wildcard. Once
  names were sent, an empty list means "nothing".
- Delta: a first request with empty subscribe and unsubscribe lists is a legacy
  wildcard; `*` in subscribe turns wildcard on, `*` in unsubscribe turns it off.
- A type subscribed to by name only (`wildcard_allowed=False`: secrets) never
  becomes wildcard: the attempt is reported (`wildcard_refused`) and ignored.

The names are a `SharedNames`: immutable, and one object for every stream that
subscribes to the same names by the same steps. Envoys of one mesh mostly
subscribe to the same clusters' endpoints, and 1,000 streams x 1,000 names held
apart cost ~32 MiB.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

WILDCARD = "*"
MAX_REMEMBERED = 64  # changes remembered per set: beyond, new ones are made afresh

_Step = tuple[frozenset[str], frozenset[str]]  # (added, removed)


class SharedNames(frozenset[str]):
    """A set of names held once however many streams subscribe to exactly it.

    `changed` answers a set with names added and removed; the same change from the
    same set answers the same object, so streams that subscribe alike share it. Each
    set remembers (weakly) the sets its changes made, while they are in use.
    """

    __slots__ = ("_made",)

    def __init__(self, names: Iterable[str] = ()) -> None:
        super().__init__()
        self._made: dict[_Step, weakref.ref[SharedNames]] = {}

    def changed(self, added: frozenset[str], removed: frozenset[str]) -> SharedNames:
        """This set with `added` and without `removed`: O(len) once per distinct change."""
        step = (added, removed)
        made = self._made.get(step)
        found = made() if made is not None else None
        if found is None:
            found = SharedNames((self | added) - removed)
            if len(self._made) >= MAX_REMEMBERED:
                self._made.clear()  # a client inventing changes cannot grow this
            forget = functools.partial(_forget, self._made, step)
            self._made[step] = weakref.ref(found, forget)
        return found


def _forget(made: dict[_Step, weakref.ref[SharedNames]], step: _Step, ref: object) -> None:
    """A set no stream holds any more: forget the change that made it."""
    if made.get(step) is ref:
        del made[step]


NO_NAMES = SharedNames()


@dataclass(frozen=True, slots=True)
class SubscriptionDiff:
    """What one request changed: names added or removed, and wildcard transitions."""

    added: frozenset[str]
    removed: frozenset[str]
    wildcard_changed: bool
    wildcard_refused: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.wildcard_changed)


@dataclass(slots=True)
class Subscription:
    """The mutable subscription of one stream to one type."""

    names: SharedNames = NO_NAMES
    wildcard: bool = False
    legacy_wildcard: bool = False
    seen_request: bool = False
    wildcard_allowed: bool = True

    def wants(self, name: str) -> bool:
        return self.wildcard or name in self.names

    def replace(self, resource_names: Iterable[str]) -> SubscriptionDiff:
        """Apply a SotW request's full list of names."""
        requested = set(resource_names)
        was_wildcard = self.wildcard
        first = not self.seen_request
        self.seen_request = True
        if not requested and (first or self.legacy_wildcard):
            self.legacy_wildcard = True
            self.wildcard = True
        else:
            self.legacy_wildcard = False
            self.wildcard = WILDCARD in requested
        requested.discard(WILDCARD)
        refused = self._refuse_wildcard()
        added = frozenset(requested - self.names)
        removed = frozenset(self.names - requested)
        if added or removed:
            self.names = self.names.changed(added, removed)
        return SubscriptionDiff(added, removed, was_wildcard != self.wildcard, refused)

    def update(self, subscribe: Iterable[str], unsubscribe: Iterable[str]) -> SubscriptionDiff:
        """Apply a delta request's subscribe and unsubscribe lists."""
        sub, unsub = set(subscribe), set(unsubscribe)
        was_wildcard = self.wildcard
        if not self.seen_request and not sub and not unsub:
            self.legacy_wildcard = True
            self.wildcard = True
        self.seen_request = True
        if WILDCARD in sub:
            self.wildcard = True
        if WILDCARD in unsub:
            self.wildcard = False
            self.legacy_wildcard = False
        sub.discard(WILDCARD)
        unsub.discard(WILDCARD)
        refused = self._refuse_wildcard()
        added = frozenset(sub - self.names)
        removed = frozenset((unsub - sub) & self.names)
        if added or removed:
            self.names = self.names.changed(added, removed)
        return SubscriptionDiff(added, removed, was_wildcard != self.wildcard, refused)

    def _refuse_wildcard(self) -> bool:
        """On a named-only type, undo a wildcard the request asked for; True if it did."""
        if self.wildcard_allowed or not self.wildcard:
            return False
        self.wildcard = False
        self.legacy_wildcard = False
        return True
