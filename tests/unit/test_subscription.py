"""Subscription rules: explicit names, wildcard, legacy wildcard (SotW and delta); names
held once for every stream that subscribes alike."""

from __future__ import annotations

import gc
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pilot.protocol.subscription import MAX_REMEMBERED, Subscription


def test_sotw_first_empty_request_is_a_legacy_wildcard_that_persists() -> None:
    sub = Subscription()
    diff = sub.replace([])
    assert sub.wildcard and sub.legacy_wildcard and diff.wildcard_changed
    sub.replace([])
    assert sub.wildcard


def test_sotw_names_after_legacy_wildcard_end_it() -> None:
    sub = Subscription()
    sub.replace([])
    sub.replace(["a"])
    assert not sub.wildcard and sub.names == {"a"}


def test_sotw_empty_after_names_unsubscribes_everything() -> None:
    sub = Subscription()
    sub.replace(["a", "b"])
    diff = sub.replace([])
    assert not sub.wildcard
    assert sub.names == set()
    assert diff.removed == {"a", "b"}


def test_sotw_explicit_wildcard_with_names() -> None:
    sub = Subscription()
    sub.replace(["*", "a"])
    assert sub.wildcard and sub.names == {"a"} and sub.wants("anything")


def test_delta_first_request_without_names_is_legacy_wildcard() -> None:
    sub = Subscription()
    sub.update([], [])
    assert sub.wildcard


def test_delta_names_do_not_end_wildcard_but_star_unsubscribe_does() -> None:
    sub = Subscription()
    sub.update(["*"], [])
    sub.update(["a"], [])
    assert sub.wildcard and sub.wants("a") and sub.wants("z")
    diff = sub.update([], ["*"])
    assert not sub.wildcard and diff.wildcard_changed and sub.wants("a") and not sub.wants("z")


def test_delta_unsubscribe_of_unknown_name_changes_nothing() -> None:
    sub = Subscription()
    sub.update(["a"], [])
    diff = sub.update([], ["never-had"])
    assert not diff.changed and sub.names == {"a"}


def test_delta_first_request_with_names_is_not_wildcard() -> None:
    sub = Subscription()
    diff = sub.update(["a"], [])
    assert not sub.wildcard and diff.added == {"a"}


def test_named_only_types_refuse_every_kind_of_wildcard() -> None:
    sotw = Subscription(wildcard_allowed=False)
    diff = sotw.replace([])
    assert diff.wildcard_refused and not sotw.wildcard and not sotw.wants("default")
    assert not sotw.replace([]).wildcard_refused, "refused once; an empty list is now nothing"
    diff = sotw.replace(["*", "default"])
    assert diff.wildcard_refused and sotw.names == {"default"} and not sotw.wants("other")

    delta = Subscription(wildcard_allowed=False)
    assert delta.update([], []).wildcard_refused and not delta.wildcard
    diff = delta.update(["*"], [])
    assert diff.wildcard_refused and not delta.wants("default") and not diff.added


# -- names held once ----------------------------------------------------------------

NAMES = st.sampled_from([f"outbound|80||svc{i}.ns.svc.cluster.local" for i in range(8)] + ["*"])
DELTA = st.tuples(st.lists(NAMES, max_size=5), st.lists(NAMES, max_size=5))


@given(st.lists(DELTA, max_size=12))
def test_delta_subscriptions_hold_what_plain_sets_would(requests: list[Any]) -> None:
    """Shared name sets change nothing of what a stream subscribes to, nor of the diffs."""
    sub, model = Subscription(), set[str]()
    for subscribe, unsubscribe in requests:
        diff = sub.update(subscribe, unsubscribe)
        sub_names, unsub_names = set(subscribe) - {"*"}, set(unsubscribe) - {"*"}
        assert diff.added == sub_names - model
        assert diff.removed == (unsub_names - sub_names) & model
        model = (model | sub_names) - diff.removed
        assert sub.names == model


@given(st.lists(st.lists(NAMES, max_size=6), max_size=10))
def test_sotw_subscriptions_hold_what_plain_sets_would(requests: list[list[str]]) -> None:
    sub, model = Subscription(), set[str]()
    for names in requests:
        diff = sub.replace(names)
        wanted = set(names) - {"*"}
        assert (diff.added, diff.removed) == (wanted - model, model - wanted)
        model = wanted
        assert sub.names == model


def test_streams_subscribing_alike_share_one_set_of_names() -> None:
    """1,000 streams subscribing to the same 1,000 names (as Envoys of one mesh do, in
    one request and then one more each) hold one set between them, not 1,000."""
    names = [f"outbound|80||svc{i}.ns.svc.cluster.local" for i in range(1000)]
    streams = [Subscription() for _ in range(1000)]
    for sub in streams:
        sub.update(names, [])
    assert len({id(sub.names) for sub in streams}) == 1
    for sub in streams:
        sub.update(["outbound|80||new.ns.svc.cluster.local"], [names[0]])
    assert len({id(sub.names) for sub in streams}) == 1
    assert len(streams[0].names) == 1000 and names[0] not in streams[0].names


def test_a_client_inventing_changes_cannot_grow_what_a_set_remembers() -> None:
    sub = Subscription()
    sub.update(["a"], [])
    start = sub.names
    keep = [start.changed(frozenset({f"x{i}"}), frozenset()) for i in range(10 * MAX_REMEMBERED)]
    assert len(start._made) <= MAX_REMEMBERED
    del keep
    gc.collect()
    assert not start._made, "changes whose sets no stream holds are forgotten"
