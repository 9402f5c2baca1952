"""A NACK that names what Envoy rejected: only those names are ERROR, the others ACKed.

Envoy applies the listeners and clusters of a response it can, and NACKs it with
`Error adding/updating listener(s) NAME: WHY` (one a line) or `... cluster(s)
NAME: WHY, NAME: WHY`. The stream machines (SotW and delta) read that: each
named resource keeps Envoy's words for it, the others count as applied. When
the words name nothing the response carried, belong to another type, or were
cut short by Envoy, the unnamed names are rejected with the whole message.
"""

from __future__ import annotations

import pytest

from pilot.protocol import DeltaRequest, DeltaStream, SotwRequest, SotwStream
from pilot.protocol.rejections import ENVOY_CUT, MAX_MESSAGE_CHARS, read_rejection
from pilot.protocol.stream import TypeState
from pilot.xds import types
from tests.unit.views import FakeView

LDS, CDS, RDS = types.LISTENER, types.CLUSTER, types.ROUTE
LISTENERS = ["0.0.0.0_80", "0.0.0.0_443", "127.0.0.1_9080", "127.0.0.1_9090", "virtualOutbound"]
BIND_80 = "cannot bind '0.0.0.0:80': Permission denied"
BIND_443 = "cannot bind '0.0.0.0:443': Permission denied"
LDS_NACK = f"Error adding/updating listener(s) 0.0.0.0_80: {BIND_80}\n0.0.0.0_443: {BIND_443}\n"


def _view(type_url: str, names: list[str]) -> FakeView:
    view = FakeView()
    for name in names:
        view.put(type_url, name, f"{name} v1")
    return view


def _sotw_nack(type_url: str, names: list[str], message: str) -> TypeState:
    """A wildcard SotW stream sent `names`, then NACKed with `message`."""
    stream = SotwStream()
    stream.on_request(SotwRequest(type_url))
    (response,) = stream.take_responses(_view(type_url, names))
    stream.on_request(SotwRequest(type_url, (), "", response.nonce, message))
    state = stream.state(type_url)
    assert state is not None
    return state


def _delta_nack(type_url: str, names: list[str], message: str) -> TypeState:
    stream = DeltaStream()
    stream.on_request(DeltaRequest(type_url, subscribe=("*",)))
    (response,) = stream.take_responses(_view(type_url, names))
    stream.on_request(DeltaRequest(type_url, response_nonce=response.nonce, error_message=message))
    state = stream.state(type_url)
    assert state is not None
    return state


@pytest.mark.parametrize("nack", [_sotw_nack, _delta_nack])
def test_envoy_naming_two_listeners_rejects_those_two_only(nack: object) -> None:
    state = nack(LDS, LISTENERS, LDS_NACK)  # type: ignore[operator]
    assert {name: r.message for name, r in state.rejected.items()} == {
        "0.0.0.0_80": BIND_80,
        "0.0.0.0_443": BIND_443,
    }
    assert state.nack is not None and state.nack.partial
    assert state.nack.blamed == ("0.0.0.0_443", "0.0.0.0_80")


def test_a_later_ack_of_the_listener_clears_its_rejection() -> None:
    stream = SotwStream()
    stream.on_request(SotwRequest(LDS))
    view = _view(LDS, LISTENERS)
    (response,) = stream.take_responses(view)
    stream.on_request(SotwRequest(LDS, (), "", response.nonce, LDS_NACK))
    state = stream.state(LDS)
    assert state is not None and set(state.rejected) == {"0.0.0.0_80", "0.0.0.0_443"}
    view.put(LDS, "127.0.0.1_9080", "v2")  # any change: the full set goes again
    stream.on_change(LDS, ["127.0.0.1_9080"])
    (again,) = stream.take_responses(view)
    stream.on_request(SotwRequest(LDS, (), again.version_info, again.nonce))
    assert state.rejected == {}, "Envoy tried them again and took them"


def test_cluster_errors_joined_by_commas_keep_their_own_commas() -> None:
    names = ["outbound|80||a.default.svc.cluster.local", "outbound|80||b.default.svc.cluster.local"]
    why = "Invalid path: /etc/x.pem, or worse"
    message = f"Error adding/updating cluster(s) {names[1]}: {why}"
    state = _sotw_nack(CDS, [*names, "c"], message)
    assert {n: r.message for n, r in state.rejected.items()} == {names[1]: why}


def test_a_message_of_another_shape_rejects_the_whole_response() -> None:
    message = "Proto constraint validation failed (ListenerValidationError.Name: empty)"
    state = _sotw_nack(LDS, LISTENERS, message)
    assert set(state.rejected) == set(LISTENERS)
    assert {r.message for r in state.rejected.values()} == {message}
    assert state.nack is not None and not state.nack.partial


def test_routes_are_all_or_nothing_even_if_the_words_look_alike() -> None:
    message = "Error adding/updating listener(s) 80: no"
    state = _sotw_nack(RDS, ["80", "9080"], message)
    assert set(state.rejected) == {"80", "9080"}


def test_names_the_response_did_not_carry_are_never_blamed() -> None:
    message = "Error adding/updating listener(s) ghost: no\n0.0.0.0_80: no\n"
    state = _sotw_nack(LDS, LISTENERS, message)
    assert "ghost" not in state.rejected
    assert set(state.rejected) == set(LISTENERS), "text before a known name: not Envoy's list"
    message = "Error adding/updating listener(s) 0.0.0.0_80: no\nghost: no\n"
    state = _sotw_nack(LDS, LISTENERS, message)
    assert {n: r.message for n, r in state.rejected.items()} == {"0.0.0.0_80": "no\\nghost: no"}


def test_envoy_cutting_its_message_leaves_the_unnamed_ones_rejected() -> None:
    message = f"Error adding/updating listener(s) 0.0.0.0_80: {BIND_80}\n0.0.0.0_4{ENVOY_CUT}"
    state = _sotw_nack(LDS, LISTENERS, message)
    assert state.rejected["0.0.0.0_80"].message == BIND_80
    others = {n: r.message for n, r in state.rejected.items() if n != "0.0.0.0_80"}
    assert set(others) == set(LISTENERS) - {"0.0.0.0_80"}
    assert set(others.values()) == {message.replace("\n", "\\n")}


def test_a_hostile_message_is_kept_bounded_and_on_one_line() -> None:
    line = "0.0.0.0_80: \x1b[2J<script>alert(1)</script>\u202e\r\n"
    message = "Error adding/updating listener(s) " + line * 40_000
    rejection = read_rejection(LDS, message, set(LISTENERS))
    assert len(rejection.message) < MAX_MESSAGE_CHARS + 50
    assert rejection.message.isprintable()
    assert all(why.isprintable() and len(why) < 1100 for why in rejection.blamed.values())
    assert set(rejection.blamed) == {"0.0.0.0_80"} and not rejection.partial
