"""`owes_now`: a stream is woken for a request only if a response may be owed.

A proxy's first request for its secret arrives while the certificate is being
minted; no response can carry it yet, so the stream's writer is not woken for
it (the mint wakes it). The rule must never hide a response that is owed:
whenever `owes_now` says no, `take_responses` has nothing to send, for both
wire variants, whatever the stream subscribed to and whatever is being made.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pilot.protocol import DeltaRequest, DeltaStream, SotwRequest, SotwStream
from pilot.xds import types
from tests.unit.views import FakeView

SECRET = types.SECRET
NAMES = ("default", "ROOTCA", "other")


def _view(made: frozenset[str], making: frozenset[str]) -> FakeView:
    view = FakeView()
    for name in made:
        view.put(SECRET, name, f"{name} v1")
    view.in_the_making[SECRET] = set(making - made)
    return view


def test_a_secret_being_minted_owes_nothing_until_it_is_made() -> None:
    view = _view(frozenset(), frozenset({"default"}))
    stream = DeltaStream()
    stream.on_request(DeltaRequest(SECRET, subscribe=("default",)))
    assert not stream.owes_now(view.pending)
    view.in_the_making[SECRET].clear()
    view.put(SECRET, "default", "certificate")
    assert stream.on_change(SECRET, ["default"])
    assert stream.owes_now(view.pending)
    (response,) = stream.take_responses(view)
    assert [r.name for r in response.resources] == ["default"]


def test_a_secret_being_minted_beside_one_made_is_owed_the_made_one() -> None:
    view = _view(frozenset({"ROOTCA"}), frozenset({"default"}))
    stream = SotwStream()
    stream.on_request(SotwRequest(SECRET, resource_names=("default", "ROOTCA")))
    assert stream.owes_now(view.pending)
    (response,) = stream.take_responses(view)
    assert [r.name for r in response.resources] == ["ROOTCA"]


subsets = st.frozensets(st.sampled_from(NAMES))


@given(subscribed=subsets.filter(bool), made=subsets, making=subsets, delta=st.booleans())
def test_whenever_nothing_is_owed_nothing_is_sent(
    subscribed: frozenset[str], made: frozenset[str], making: frozenset[str], delta: bool
) -> None:
    view = _view(made, making)
    names = tuple(sorted(subscribed))
    if delta:
        stream: DeltaStream | SotwStream = DeltaStream()
        stream.on_request(DeltaRequest(SECRET, subscribe=names))
    else:
        stream = SotwStream()
        stream.on_request(SotwRequest(SECRET, resource_names=names))
    owed = stream.owes_now(view.pending)
    responses = stream.take_responses(view)
    if not owed:
        assert responses == []
    assert owed == (not subscribed <= (making - made)), "owed exactly unless all are in the making"
