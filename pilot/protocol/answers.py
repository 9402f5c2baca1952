"""Answers shared by streams that subscribe alike (`FirstAnswer`), for both wire variants.

The Envoys of one mesh subscribe to the same names: after a restart, a thousand
of them ask for the same thousand clusters and assignments within a second.
What a stream holding nothing is owed for a subscription depends only on that
subscription and on what the stream reads (`ResourceView.first_answers`, kept
per table while the type's tables hold what they hold), so it is worked out once and read by
every stream that subscribes alike: the resources, the names to answer as
removed (delta), the name -> version entries the stream records as sent, and
the last wire bytes made of it (`wire`, for streams whose nonce is the same).
A SotW stream's full state of a wildcard-capable type is shared the same way,
at every push, not only the first.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from pilot.protocol.messages import AnswerStore, ResourceView, Wire
from pilot.protocol.stream import TypeState
from pilot.protocol.subscription import WILDCARD
from pilot.xds.resource import Resource


@dataclass(frozen=True, slots=True)
class FirstAnswer:
    """What a subscription is owed, shared by every stream that subscribes alike."""

    updated: tuple[Resource, ...]
    removed: tuple[str, ...]
    versions: Mapping[str, str]
    names: tuple[str, ...]
    wire: Wire = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, updated: tuple[Resource, ...], removed: tuple[str, ...]) -> FirstAnswer:
        names = tuple(r.name for r in updated)
        return cls(updated, removed, {r.name: r.version for r in updated}, names)

    @classmethod
    def work_out(cls, state: TypeState, view: ResourceView) -> FirstAnswer:
        """As a stream holding nothing would be answered: every wanted name that exists is
        sent; a name asked for by name that does not exist is answered as removed."""
        lookup = view.lookup(state.type_url)
        if state.subscription.wildcard:
            wanted = sorted(view.names(state.type_url))
        else:
            wanted = sorted(state.subscription.names)
        updated: list[Resource] = []
        removed: list[str] = []
        for name in wanted:
            resource = lookup(name)
            if resource is None:
                removed.append(name)
            else:
                updated.append(resource)
        return cls.of(tuple(updated), tuple(removed))


def shared_first_answer(state: TypeState, view: ResourceView, answers: AnswerStore) -> FirstAnswer:
    """The first answer for this stream's subscription, worked out once per subscription."""
    subscription = state.subscription
    key = WILDCARD if subscription.wildcard else subscription.names
    return remembered(answers, key, lambda: FirstAnswer.work_out(state, view))


def remembered(
    answers: AnswerStore | None, key: Hashable, make: Callable[[], FirstAnswer]
) -> FirstAnswer:
    """The answer the memo holds under `key`, else `make`'s, remembered if there is room."""
    found = answers.get(key) if answers is not None else None
    if isinstance(found, FirstAnswer):
        return found
    made = make()
    if answers is not None:
        answers.put(key, made, len(made.names) + len(made.removed))
    return made
