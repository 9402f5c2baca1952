"""Subscription rules: explicit names, wildcard, legacy wildcard (SotW and delta)."""

from __future__ import annotations

from pilot.protocol.subscription import Subscription


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
