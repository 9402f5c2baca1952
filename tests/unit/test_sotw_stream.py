"""The SotW state machine against the protocol checklist, without sockets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.protocol import Acked, Nacked, ProtocolError, SotwRequest, SotwStream, StaleNonce
from pilot.xds import types
from tests.unit.views import FakeView, view_with

CDS, EDS = types.CLUSTER, types.ENDPOINT


def test_empty_type_url_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="type_url"):
        SotwStream().on_request(SotwRequest(""))


def test_wildcard_cds_gets_the_full_set_even_when_empty() -> None:
    stream = SotwStream()
    stream.on_request(SotwRequest(CDS))
    (response,) = stream.take_responses(FakeView())
    assert response.resources == ()
    view = view_with("a", "b")
    stream.on_full_change(CDS)
    (response,) = stream.take_responses(view)
    assert [r.name for r in response.resources] == ["a", "b"]


def test_cds_removal_is_a_response_without_the_name() -> None:
    view = view_with("a", "b")
    stream = SotwStream()
    stream.on_request(SotwRequest(CDS))
    stream.take_responses(view)
    view.delete(CDS, "b")
    stream.on_change(CDS, ["b"])
    (response,) = stream.take_responses(view)
    assert [r.name for r in response.resources] == ["a"]


def test_ack_is_matched_by_nonce_and_needs_no_response() -> None:
    view = view_with("a")
    stream = SotwStream()
    stream.on_request(SotwRequest(CDS))
    (response,) = stream.take_responses(view)
    events = stream.on_request(
        SotwRequest(CDS, version_info=response.version_info, response_nonce=response.nonce)
    )
    assert events == [Acked(CDS, response.nonce, response.version_info)]
    assert stream.take_responses(view) == []


def test_nack_is_recorded_by_error_detail_and_not_resent() -> None:
    view = view_with("a")
    stream = SotwStream()
    stream.on_request(SotwRequest(CDS))
    (response,) = stream.take_responses(view)
    events = stream.on_request(
        SotwRequest(CDS, version_info="", response_nonce=response.nonce, error_message="bad")
    )
    assert events == [Nacked(CDS, response.nonce, response.version_info, "bad")]
    assert stream.take_responses(view) == []
    state = stream.state(CDS)
    assert state is not None and state.nack is not None and state.nack.message == "bad"


def test_stale_nonce_is_not_an_ack_but_its_names_count() -> None:
    view = view_with("a", "b")
    stream = SotwStream()
    stream.on_request(SotwRequest(EDS, ("a",)))
    (first,) = stream.take_responses(view)
    view.put(EDS, "a", "endpoints a v2")
    stream.on_change(EDS, ["a"])
    (second,) = stream.take_responses(view)
    events = stream.on_request(SotwRequest(EDS, ("a", "b"), response_nonce=first.nonce))
    assert StaleNonce(EDS, first.nonce) in events
    assert not any(isinstance(e, Acked) for e in events)
    (third,) = stream.take_responses(view)
    assert [r.name for r in third.resources] == ["b"]
    assert second.nonce != third.nonce


def test_named_type_answers_new_names_even_if_unchanged() -> None:
    view = view_with("a", "b")
    stream = SotwStream()
    stream.on_request(SotwRequest(EDS, ("a",)))
    (first,) = stream.take_responses(view)
    stream.on_request(SotwRequest(EDS, ("a", "b"), response_nonce=first.nonce))
    (second,) = stream.take_responses(view)
    assert [r.name for r in second.resources] == ["b"]


def test_resubscribe_after_unsubscribe_is_answered() -> None:
    view = view_with("a")
    stream = SotwStream()
    stream.on_request(SotwRequest(EDS, ("a",)))
    (first,) = stream.take_responses(view)
    stream.on_request(SotwRequest(EDS, (), response_nonce=first.nonce))
    assert stream.take_responses(view) == []
    stream.on_request(SotwRequest(EDS, ("a",), response_nonce=first.nonce))
    (again,) = stream.take_responses(view)
    assert [r.name for r in again.resources] == ["a"]


def test_missing_named_resource_is_sent_when_it_appears() -> None:
    view = view_with()
    stream = SotwStream()
    stream.on_request(SotwRequest(EDS, ("later",)))
    assert stream.take_responses(view) == []
    view.put(EDS, "later", "endpoints")
    assert stream.on_change(EDS, ["later"])
    (response,) = stream.take_responses(view)
    assert [r.name for r in response.resources] == ["later"]


def test_unchanged_content_is_not_resent() -> None:
    view = view_with("a")
    stream = SotwStream()
    stream.on_request(SotwRequest(EDS, ("a",)))
    stream.take_responses(view)
    view.put(EDS, "a", "endpoints a v1")  # same bytes, same version
    stream.on_change(EDS, ["a"])
    assert stream.take_responses(view) == []


def test_changes_to_unsubscribed_names_do_not_concern_the_stream() -> None:
    view = view_with("a", "b")
    stream = SotwStream()
    stream.on_request(SotwRequest(EDS, ("a",)))
    stream.take_responses(view)
    assert not stream.on_change(EDS, ["b"])


def test_cluster_push_is_followed_by_their_assignments() -> None:
    view = view_with("a", "b")
    stream = SotwStream()
    stream.on_request(SotwRequest(CDS))
    stream.on_request(SotwRequest(EDS, ("a", "b")))
    first = stream.take_responses(view)
    assert [r.type_url for r in first] == [CDS, EDS]
    view.put(CDS, "a", "cluster a changed")
    stream.on_change(CDS, ["a"])
    cds, eds = stream.take_responses(view)
    assert cds.type_url == CDS and eds.type_url == EDS
    assert {r.name for r in eds.resources} == {"a", "b"}


def test_responses_never_repeat_a_name() -> None:
    view = view_with("a")
    stream = SotwStream()
    stream.on_request(SotwRequest(EDS, ("a", "a")))
    stream.force(EDS, ["a"])
    (response,) = stream.take_responses(view)
    assert [r.name for r in response.resources] == ["a"]


# -- model check: a client that applies every response always converges ----------

NAMES = ["a", "b", "c", "d"]
operation = st.one_of(
    st.tuples(st.just("subscribe"), st.sets(st.sampled_from(NAMES))),
    st.tuples(st.just("update"), st.sampled_from(NAMES), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("reply"), st.booleans(), st.booleans()),
)


class SotwClient:
    """What an Envoy holds for a named type: the last version received per name."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}
        self.names: set[str] = set()
        self.last_nonce = ""
        self.stale_nonce = ""
        self.wildcard = False
        self.started = False

    def wants(self, name: str) -> bool:
        return self.wildcard or name in self.names

    def subscribe(self, names: set[str]) -> None:
        """Legacy wildcard: an empty first list, kept while the lists stay empty."""
        self.wildcard = not names and (self.wildcard or not self.started)
        self.started = True
        self.names = names

    def apply(self, stream: SotwStream, view: FakeView) -> None:
        for response in stream.take_responses(view):
            names = [r.name for r in response.resources]
            assert len(names) == len(set(names)), "a name twice in one response"
            assert all(self.wants(n) for n in names), "sent a name the client did not ask for"
            for resource in response.resources:
                self.held[resource.name] = resource.version
            self.stale_nonce, self.last_nonce = self.last_nonce, response.nonce


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=30))
def test_sotw_client_converges_to_server_state(operations: list[tuple[object, ...]]) -> None:
    view, stream, client = FakeView(), SotwStream(), SotwClient()
    for op in operations:
        if op[0] == "subscribe":
            client.subscribe(set(op[1]))  # type: ignore[arg-type]
            stream.on_request(
                SotwRequest(EDS, tuple(sorted(client.names)), response_nonce=client.last_nonce)
            )
        elif op[0] == "update":
            view.put(EDS, str(op[1]), f"v{op[2]}")
            stream.on_change(EDS, [str(op[1])])
        elif op[0] == "delete":
            view.delete(EDS, str(op[1]))
            stream.on_change(EDS, [str(op[1])])
        elif client.started:
            nonce = client.stale_nonce if op[2] else client.last_nonce
            stream.on_request(
                SotwRequest(
                    EDS,
                    tuple(sorted(client.names)),
                    response_nonce=nonce,
                    error_message="x" if op[1] else None,
                )
            )
        client.apply(stream, view)
    for name, resource in view.tables.get(EDS, {}).items():
        if client.wants(name):
            assert client.held.get(name) == resource.version, name


def test_a_rejected_assignment_stays_rejected_past_an_ack_of_other_names() -> None:
    """SotW EDS responses carry only what changed, as delta ones do: an ACK of `a`
    says nothing of `b`, which the client rejected and still holds at its older version."""
    view = view_with("a", "b")
    stream = SotwStream()

    def push(name: str, content: str, error: str | None = None) -> None:
        view.put(EDS, name, content)
        stream.on_change(EDS, [name])
        (response,) = stream.take_responses(view)
        assert [r.name for r in response.resources] == [name]
        stream.on_request(SotwRequest(EDS, ("a", "b"), "", response.nonce, error))

    stream.on_request(SotwRequest(EDS, ("a", "b")))
    (first,) = stream.take_responses(view)
    stream.on_request(SotwRequest(EDS, ("a", "b"), first.version_info, first.nonce))
    push("b", "b v2", error="malformed b")
    state = stream.state(EDS)
    assert state is not None and set(state.rejected) == {"b"}
    push("a", "a v2")
    assert set(state.rejected) == {"b"}, "an ACK of `a` cleared b's rejection"
    push("b", "b v3")
    assert state.rejected == {}
