"""The subscriber index: who is woken for a name, and what streams cost it as they come and go."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.push.subscribers import SubscriberIndex
from pilot.xds.proxy import ProxyKey

EDS = "eds"
NAMES = [f"n{i}" for i in range(6)]


@dataclass(frozen=True)
class Watcher:
    id: int

    @property
    def proxy(self) -> ProxyKey:
        return ProxyKey(f"proxy-{self.id % 2}", None)


# (watcher, names it now holds, wildcard) or (watcher, None: it leaves)
steps = st.lists(
    st.tuples(
        st.integers(0, 4),
        st.one_of(st.none(), st.frozensets(st.sampled_from(NAMES))),
        st.booleans(),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_the_index_wakes_exactly_who_subscribes_and_forgets_streams_that_leave(
    plan: list[tuple[int, frozenset[str] | None, bool]],
) -> None:
    index: SubscriberIndex[Watcher] = SubscriberIndex()
    model: dict[Watcher, tuple[frozenset[str], bool]] = {}
    for number, names, wildcard in plan:
        watcher = Watcher(number)
        if names is None:
            index.leave(watcher, [EDS])
            model.pop(watcher, None)
            continue
        index.join(watcher)
        index.apply(watcher, EDS, names, wildcard)
        model[watcher] = (names, wildcard)
        for name in NAMES:
            expected = {w for w, (held, every) in model.items() if every or name in held}
            assert index.watchers(EDS, [name]) == expected
    for watcher in list(model):
        assert index.names_of(watcher, EDS) == model[watcher][0]
        index.leave(watcher, [EDS])
    assert index.watchers(EDS, NAMES) == set()
    assert not index._by_name.get(EDS), "every name unindexed once every stream left"


def test_streams_that_subscribe_alike_index_their_names_once() -> None:
    index: SubscriberIndex[Watcher] = SubscriberIndex()
    names = frozenset(f"cluster-{i}" for i in range(1000))
    indexed = _count_indexing(index)
    for number in range(100):
        index.apply(Watcher(number), EDS, names, False)
    assert indexed == [1000], "one set of names, indexed once for 100 streams"
    assert len(index.watchers(EDS, ["cluster-7"])) == 100


def test_a_stream_flipping_one_name_costs_one_name_not_its_whole_subscription() -> None:
    """A client that adds and removes one name again and again, beside others holding the
    same 10,000 names, makes pilot index that one name, never the 10,000 again."""
    index: SubscriberIndex[Watcher] = SubscriberIndex()
    crowd = frozenset(f"cluster-{i}" for i in range(10_000))
    index.apply(Watcher(0), EDS, crowd, False)
    flipper = Watcher(1)
    index.apply(flipper, EDS, crowd, False)
    indexed = _count_indexing(index)
    for _ in range(50):
        index.apply(flipper, EDS, crowd | {"extra"}, False)
        assert index.watchers(EDS, ["extra"]) == {flipper}
        index.apply(flipper, EDS, crowd, False)
        assert index.watchers(EDS, ["extra"]) == set()
    assert sum(indexed) <= 10_000 + 50, f"indexed {sum(indexed)} names for 100 one-name changes"


def _count_indexing(index: SubscriberIndex[Watcher]) -> list[int]:
    """Record how many names each call to the index's `_index` adds."""
    counts: list[int] = []
    original = index._index

    def counting(type_url: str, names: object, group: object) -> None:
        names = list(names)  # type: ignore[call-overload]
        counts.append(len(names))
        original(type_url, names, group)  # type: ignore[arg-type]

    index._index = counting  # type: ignore[method-assign]
    return counts
