"""The bench's go-control-plane peers: which `--peers` a run takes, and the check that a
peer's clients were given the same mesh as pilot's before its figures are shown."""

from __future__ import annotations

from collections import Counter

import pytest

from bench import peers, wire
from bench.report import PhaseResult
from bench.run import PhaseRun, same_mesh


@pytest.mark.parametrize(
    ("text", "kinds"),
    [
        ("auto", None),
        ("none", ()),
        ("snapshot", ("snapshot",)),
        ("linear, snapshot,linear", ("linear", "snapshot")),
    ],
)
def test_peers_named(text: str, kinds: tuple[str, ...] | None) -> None:
    assert peers.parse(text) == kinds


@pytest.mark.parametrize("text", ["", "linear,mux", "Linear", ","])
def test_unknown_peers_refused(text: str) -> None:
    with pytest.raises(ValueError, match="linear, snapshot"):
        peers.parse(text)


def _phase(assignments: int, routes: int = 0) -> PhaseRun:
    result = PhaseResult([0.001], 0.001, 0, 1, 1, 0.1, 0.001, [1], 1.0)
    return PhaseRun(result, [0.0], [], Counter({wire.ENDPOINT: assignments, wire.ROUTE: routes}))


def test_a_peer_whose_clients_followed_fewer_assignments_fails_the_run() -> None:
    with pytest.raises(RuntimeError, match=r"gcp-linear: the clients followed .* not the same"):
        same_mesh("gcp-linear", _phase(5000), _phase(4995))


def test_a_peer_whose_clients_followed_the_same_passes() -> None:
    same_mesh("gcp-snapshot", _phase(5000), _phase(5000))
    # A type no client followed is the same as one not reported.
    same_mesh(
        "floor",
        _phase(5000, routes=0),
        PhaseRun(_phase(0).result, [], [], Counter({wire.ENDPOINT: 5000})),
    )


async def test_no_peers_asked_builds_nothing_and_says_so() -> None:
    chosen = await peers.resolve(())
    assert chosen.kinds == () and chosen.binary is None
    assert chosen.note == "go-control-plane: not run (--peers none)"


async def test_peers_named_without_go_fail_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "go_found", lambda: False)
    with pytest.raises(RuntimeError, match="--peers linear: needs Go"):
        await peers.resolve(("linear",))
    chosen = await peers.resolve(None)  # auto: none, said in the report
    assert chosen.kinds == () and "no Go" in chosen.note
