"""The delta state machine against the protocol checklist, without sockets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.protocol import Acked, DeltaRequest, DeltaStream, Nacked, StaleNonce
from pilot.protocol.stream import MAX_UNACKED
from pilot.xds import types
from tests.unit.views import FakeView, view_with

CDS, EDS = types.CLUSTER, types.ENDPOINT


def _names(response: object) -> list[str]:
    return [r.name for r in response.resources]  # type: ignore[attr-defined]


def test_every_subscribed_name_is_answered_even_if_held() -> None:
    view = view_with("a")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(EDS, subscribe=("a",)))
    (first,) = stream.take_responses(view)
    stream.on_request(DeltaRequest(EDS, subscribe=("a",), response_nonce=first.nonce))
    (again,) = stream.take_responses(view)
    assert _names(again) == ["a"]


def test_missing_name_is_removed_then_pushed_when_it_appears() -> None:
    view = view_with()
    stream = DeltaStream()
    stream.on_request(DeltaRequest(EDS, subscribe=("x",)))
    (response,) = stream.take_responses(view)
    assert response.removed == ("x",) and response.resources == ()
    view.put(EDS, "x", "now")
    assert stream.on_change(EDS, ["x"])
    (pushed,) = stream.take_responses(view)
    assert _names(pushed) == ["x"]


def test_only_changed_resources_are_sent() -> None:
    view = view_with("a", "b")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(EDS, subscribe=("a", "b")))
    stream.take_responses(view)
    view.put(EDS, "a", "a v2")
    stream.on_change(EDS, ["a", "b"])
    (response,) = stream.take_responses(view)
    assert _names(response) == ["a"]


def test_reconnect_with_initial_versions_sends_only_differences() -> None:
    view = view_with("same", "changed")
    stale = view.get(EDS, "changed")
    assert stale is not None
    view.put(EDS, "changed", "changed v2")
    current = view.get(EDS, "same")
    assert current is not None
    stream = DeltaStream()
    stream.on_request(
        DeltaRequest(
            EDS,
            subscribe=("same", "changed", "gone"),
            initial_resource_versions={
                "same": current.version,
                "changed": stale.version,
                "gone": "1",
            },
        )
    )
    (response,) = stream.take_responses(view)
    assert _names(response) == ["changed"]
    assert response.removed == ("gone",)


def test_unsubscribe_forgets_so_resubscribe_is_answered() -> None:
    view = view_with("a")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(EDS, subscribe=("a",)))
    stream.take_responses(view)
    stream.on_request(DeltaRequest(EDS, unsubscribe=("a",)))
    assert stream.take_responses(view) == []
    assert not stream.on_change(EDS, ["a"])
    stream.on_request(DeltaRequest(EDS, subscribe=("a",)))
    (response,) = stream.take_responses(view)
    assert _names(response) == ["a"]


def test_unsubscribe_of_never_held_name_needs_no_response() -> None:
    view = view_with("a")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(EDS, subscribe=("a",)))
    stream.take_responses(view)
    stream.on_request(DeltaRequest(EDS, unsubscribe=("zzz",)))
    assert stream.take_responses(view) == []


def test_unsubscribed_name_still_wildcard_is_sent_again() -> None:
    view = view_with("a", "b")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(CDS, subscribe=("*", "a")))
    stream.take_responses(view)
    stream.on_request(DeltaRequest(CDS, unsubscribe=("a",)))
    (response,) = stream.take_responses(view)
    assert _names(response) == ["a"]


def test_legacy_wildcard_gets_everything_and_removals() -> None:
    view = view_with("a", "b")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(CDS))
    (response,) = stream.take_responses(view)
    assert sorted(_names(response)) == ["a", "b"]
    view.delete(CDS, "b")
    stream.on_change(CDS, ["b"])
    (removal,) = stream.take_responses(view)
    assert removal.removed == ("b",) and removal.resources == ()


def test_star_unsubscribe_leaves_wildcard() -> None:
    view = view_with("a")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(CDS, subscribe=("*",)))
    stream.take_responses(view)
    stream.on_request(DeltaRequest(CDS, unsubscribe=("*",)))
    view.put(CDS, "new", "cluster")
    assert not stream.on_change(CDS, ["new"])


def test_ack_nack_and_stale_nonce() -> None:
    view = view_with("a")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(EDS, subscribe=("a",)))
    (first,) = stream.take_responses(view)
    assert stream.on_request(DeltaRequest(EDS, response_nonce=first.nonce)) == [
        Acked(EDS, first.nonce, first.system_version_info)
    ]
    view.put(EDS, "a", "a v2")
    stream.on_change(EDS, ["a"])
    (second,) = stream.take_responses(view)
    events = stream.on_request(DeltaRequest(EDS, response_nonce=second.nonce, error_message="no"))
    assert events == [Nacked(EDS, second.nonce, second.system_version_info, "no")]
    assert stream.take_responses(view) == [], "a NACKed version is not resent in a loop"
    stale = stream.on_request(DeltaRequest(EDS, subscribe=("b",), response_nonce=first.nonce))
    assert StaleNonce(EDS, first.nonce) in stale
    (third,) = stream.take_responses(view)
    assert third.removed == ("b",), "a stale request's subscription still counts"


def test_cluster_push_is_followed_by_their_assignments() -> None:
    view = view_with("a", "b")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(CDS, subscribe=("*",)))
    stream.on_request(DeltaRequest(EDS, subscribe=("a", "b")))
    stream.take_responses(view)
    view.put(CDS, "a", "cluster a v2")
    stream.on_change(CDS, ["a"])
    cds, eds = stream.take_responses(view)
    assert (cds.type_url, _names(cds)) == (CDS, ["a"])
    assert (eds.type_url, _names(eds)) == (EDS, ["a"])


# -- model check: a delta client's view always converges to the server's state -----

NAMES = ["a", "b", "c", "d"]
operation = st.one_of(
    st.tuples(st.just("subscribe"), st.sets(st.sampled_from([*NAMES, "*"]), max_size=2)),
    st.tuples(st.just("unsubscribe"), st.sets(st.sampled_from([*NAMES, "*"]), max_size=2)),
    st.tuples(st.just("update"), st.sampled_from(NAMES), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("reconnect")),
)


class DeltaClient:
    """An Envoy-like delta client: holds name -> version, applies responses."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}
        self.names: set[str] = set()
        self.wildcard = False

    def wants(self, name: str) -> bool:
        return self.wildcard or name in self.names

    def apply(self, stream: DeltaStream, view: FakeView) -> None:
        for response in stream.take_responses(view):
            names = [r.name for r in response.resources]
            assert len(names) == len(set(names))
            assert not set(names) & set(response.removed)
            for resource in response.resources:
                assert self.wants(resource.name), f"unrequested {resource.name}"
                self.held[resource.name] = resource.version
            for name in response.removed:
                self.held.pop(name, None)


def _step(
    op: tuple[object, ...], view: FakeView, stream: DeltaStream, client: DeltaClient
) -> DeltaStream:
    kind = op[0]
    first = not stream.type_urls()
    if first and kind in ("subscribe", "unsubscribe") and not op[1]:
        client.wildcard = True  # an empty first request is a legacy wildcard
    if kind == "subscribe":
        names = set(op[1])  # type: ignore[arg-type]
        client.wildcard |= "*" in names
        client.names |= names - {"*"}
        stream.on_request(DeltaRequest(EDS, subscribe=tuple(sorted(names))))
    elif kind == "unsubscribe":
        names = set(op[1])  # type: ignore[arg-type]
        if "*" in names:
            client.wildcard = False
        for name in names - {"*"}:
            client.names.discard(name)
            client.held.pop(name, None)  # Envoy drops what it unsubscribes
        if not client.wildcard:
            client.held = {n: v for n, v in client.held.items() if n in client.names}
        stream.on_request(DeltaRequest(EDS, unsubscribe=tuple(sorted(names))))
    elif kind == "update":
        view.put(EDS, str(op[1]), f"v{op[2]}")
        stream.on_change(EDS, [str(op[1])])
    elif kind == "delete":
        view.delete(EDS, str(op[1]))
        stream.on_change(EDS, [str(op[1])])
    else:
        stream = DeltaStream()
        subscribe = sorted(client.names | ({"*"} if client.wildcard else set()))
        if subscribe:
            stream.on_request(
                DeltaRequest(
                    EDS, subscribe=tuple(subscribe), initial_resource_versions=dict(client.held)
                )
            )
    return stream


@settings(max_examples=400, deadline=None)
@given(st.lists(operation, max_size=30))
def test_delta_client_converges_to_server_state(operations: list[tuple[object, ...]]) -> None:
    view, stream, client = FakeView(), DeltaStream(), DeltaClient()
    for op in operations:
        stream = _step(op, view, stream, client)
        client.apply(stream, view)
    expected = {
        name: r.version for name, r in view.tables.get(EDS, {}).items() if client.wants(name)
    }
    held_wanted = {n: v for n, v in client.held.items() if client.wants(n)}
    assert held_wanted == expected


def test_a_resource_in_the_making_is_not_answered_as_removed() -> None:
    view = FakeView()
    view.in_the_making[types.SECRET] = {"default"}
    stream = DeltaStream()
    stream.on_request(DeltaRequest(types.SECRET, subscribe=("default", "nonexistent")))
    (response,) = stream.take_responses(view)
    assert response.removed == ("nonexistent",), "only the name that does not exist is removed"
    assert stream.take_responses(view) == []
    view.in_the_making[types.SECRET].clear()
    view.put(types.SECRET, "default", "certificate")
    stream.on_change(types.SECRET, ["default"])
    (minted,) = stream.take_responses(view)
    assert _names(minted) == ["default"] and minted.removed == ()


def test_a_new_wildcard_is_answered_even_when_empty() -> None:
    stream = DeltaStream()
    stream.on_request(DeltaRequest(CDS, subscribe=("*",)))
    (response,) = stream.take_responses(FakeView())
    assert response.resources == () and response.removed == ()
    stream.on_request(DeltaRequest(CDS, response_nonce=response.nonce))
    assert stream.take_responses(FakeView()) == [], "an ACK of it needs no answer"


def test_removals_wait_for_every_addition_of_the_push() -> None:
    view = view_with("a", "b")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(CDS, subscribe=("*",)))
    stream.on_request(DeltaRequest(EDS, subscribe=("a", "b", "c")))
    stream.take_responses(view)
    view.delete(CDS, "b")
    view.delete(EDS, "b")
    view.put(CDS, "c", "cluster c")
    view.put(EDS, "c", "endpoints c")
    stream.on_change(CDS, ["b", "c"])
    stream.on_change(EDS, ["b", "c"])
    responses = stream.take_responses(view)
    kinds = [(r.type_url, _names(r), r.removed) for r in responses]
    assert kinds == [(CDS, ["c"], ()), (EDS, ["c"], ("b",)), (CDS, [], ("b",))]


def test_a_client_that_never_acks_is_remembered_in_bounded_space() -> None:
    """What CSDS needs (which unACKed response carried a name) stays bounded however
    many responses a client leaves unACKed, and is forgotten once it ACKs."""
    view = view_with("a", "b")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(EDS, subscribe=("a", "b")))
    (first,) = stream.take_responses(view)
    for version in range(3 * MAX_UNACKED):
        view.put(EDS, "a", f"a v{version}")
        stream.on_change(EDS, ["a"])
        (last,) = stream.take_responses(view)
    state = stream.state(EDS)
    assert state is not None
    assert len(state.unacked) <= MAX_UNACKED
    assert state.sent_seq("a") == int(last.nonce)  # the latest response carried it
    assert int(first.nonce) <= state.sent_seq("b") < int(last.nonce)  # never claimed ACKed
    events = stream.on_request(DeltaRequest(EDS, response_nonce=last.nonce))
    assert isinstance(events[0], Acked)
    assert state.sent_seq("a") == state.sent_seq("b") == 0 and not state.unacked


def _push(stream: DeltaStream, view: FakeView, name: str, content: str) -> object:
    """A new version of `name`, and the one response that carries it."""
    view.put(EDS, name, content)
    stream.on_change(EDS, [name])
    (response,) = stream.take_responses(view)
    assert _names(response) == [name]
    return response


def _answer(stream: DeltaStream, response: object, error: str | None = None) -> None:
    nonce = response.nonce  # type: ignore[attr-defined]
    stream.on_request(DeltaRequest(EDS, response_nonce=nonce, error_message=error))


def test_a_rejected_name_stays_rejected_until_a_response_carrying_it_is_acked() -> None:
    """Delta sends only what changed: an ACK of other names says nothing of a NACKed
    one, which the client still holds at its older version (CSDS shows it ERROR)."""
    view = view_with("a", "b")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(EDS, subscribe=("a", "b")))
    (first,) = stream.take_responses(view)
    _answer(stream, first)
    state = stream.state(EDS)
    assert state is not None and state.rejected == {}
    _answer(stream, _push(stream, view, "b", "b v2"), error="malformed b")
    nack = state.nack
    assert nack is not None and nack.message == "malformed b"
    assert state.rejected == {"b": nack}
    _answer(stream, _push(stream, view, "a", "a v2"))
    assert state.rejected == {"b": nack}, "an ACK of `a` cleared b's rejection"
    _answer(stream, _push(stream, view, "b", "b v3"))
    assert state.rejected == {}


def test_a_rejection_is_forgotten_with_the_name() -> None:
    view = view_with("a", "b")
    stream = DeltaStream()
    stream.on_request(DeltaRequest(EDS, subscribe=("a", "b")))
    (first,) = stream.take_responses(view)
    _answer(stream, first, error="both bad")
    state = stream.state(EDS)
    assert state is not None and set(state.rejected) == {"a", "b"}
    stream.on_request(DeltaRequest(EDS, unsubscribe=("b",)))
    _answer(stream, _push(stream, view, "a", "a v2"))
    assert state.rejected == {}, "kept the rejection of a name no longer held"
