"""Shared first answers: streams that subscribe alike get, byte for byte, what each would
have been owed alone, whatever they did before and whatever changed meanwhile."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pilot.protocol import DeltaRequest, DeltaStream, SotwRequest, SotwStream
from pilot.server import convert
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.proxy import ProxyKey
from pilot.xds.resource import Resource
from tests.unit.views import FakeView

CDS, EDS = types.CLUSTER, types.ENDPOINT
NAMES = ["a", "b", "c", "d"]

# One step: a stream's request (type, subscribe, unsubscribe, initial versions, ACK the last),
# a resource changing (put or delete), or a stream's writer running.
requests = st.tuples(
    st.just("request"),
    st.integers(0, 3),
    st.sampled_from([CDS, EDS]),
    st.lists(st.sampled_from([*NAMES, "*"]), max_size=3),
    st.lists(st.sampled_from([*NAMES, "*"]), max_size=2),
    st.dictionaries(st.sampled_from(NAMES), st.sampled_from(["", "stale"]), max_size=2),
    st.booleans(),
)
changes = st.tuples(
    st.just("change"), st.sampled_from([CDS, EDS]), st.sampled_from(NAMES), st.booleans()
)
writes = st.tuples(st.just("write"), st.integers(0, 3))
plans = st.lists(st.one_of(requests, changes, writes), max_size=30)


class World:
    """Four streams on one view, sharing first answers or not."""

    def __init__(self, share: bool, sotw: bool = False) -> None:
        self.sotw = sotw
        self.view = FakeView()
        self.view.share_answers = share
        for name in NAMES[:3]:
            self.view.put(CDS, name, f"cluster {name}")
            self.view.put(EDS, name, f"endpoints {name}")
        self.streams: list[DeltaStream | SotwStream] = [
            SotwStream() if sotw else DeltaStream() for _ in range(4)
        ]
        self.nonces: dict[tuple[int, str], str] = {}
        self.wire: list[bytes] = []

    def step(self, step: tuple[object, ...]) -> None:
        if step[0] == "request":
            _, number, type_url, subscribe, unsubscribe, versions, ack = step
            stream = self.streams[number]  # type: ignore[index]
            state = stream.state(type_url)  # type: ignore[arg-type]
            first = state is None or not state.subscription.seen_request
            nonce = self.nonces.get((number, type_url), "") if ack else ""  # type: ignore[arg-type]
            if self.sotw:
                held = state.subscription.names if state is not None else frozenset()
                names = (set(held) | set(subscribe)) - set(unsubscribe)  # type: ignore[arg-type]
                sotw = SotwRequest(type_url, tuple(sorted(names)), response_nonce=nonce)  # type: ignore[arg-type]
                stream.on_request(sotw)  # type: ignore[arg-type]
                return
            request = DeltaRequest(
                type_url,  # type: ignore[arg-type]
                subscribe=tuple(subscribe),  # type: ignore[arg-type]
                unsubscribe=tuple(unsubscribe),  # type: ignore[arg-type]
                initial_resource_versions=versions if first else {},  # type: ignore[arg-type]
                response_nonce=nonce,
            )
            stream.on_request(request)  # type: ignore[arg-type]
        elif step[0] == "change":
            _, type_url, name, present = step
            if present:
                self.view.put(type_url, name, f"{type_url} {name} {len(self.wire)}")  # type: ignore[arg-type]
            else:
                self.view.delete(type_url, name)  # type: ignore[arg-type]
            for stream in self.streams:
                stream.on_change(type_url, [name])  # type: ignore[arg-type]
        else:
            number = step[1]
            for response in self.streams[number].take_responses(self.view):  # type: ignore[index]
                self.nonces[(number, response.type_url)] = response.nonce  # type: ignore[index]
                self.wire.append(convert.encode(response))


@settings(max_examples=400, deadline=None)
@given(plans)
@example(  # a name answered as missing is not answered again until it appears
    [("request", 0, EDS, ["d"], [], {}, False), ("write", 0), ("change", EDS, "d", False)]
)
@example(  # a reconnecting stream's claims are its own: no shared answer
    [("request", 0, CDS, ["*"], [], {"a": "stale"}, False), ("request", 1, CDS, [], [], {}, False)]
)
def test_shared_first_answers_are_the_answers_each_stream_would_get_alone(
    plan: list[tuple[object, ...]],
) -> None:
    _same_bytes_either_way(plan, sotw=False)


@settings(max_examples=300, deadline=None)
@given(plans)
@example(  # a full state re-answered after a change, then after an unsubscribe
    [
        ("request", 0, CDS, ["a", "b"], [], {}, False),
        ("write", 0),
        ("change", CDS, "a", True),
        ("write", 0),
        ("request", 0, CDS, [], ["a"], {}, True),
        ("write", 0),
    ]
)
def test_shared_sotw_answers_are_the_answers_each_stream_would_get_alone(
    plan: list[tuple[object, ...]],
) -> None:
    _same_bytes_either_way(plan, sotw=True)


def _same_bytes_either_way(plan: list[tuple[object, ...]], *, sotw: bool) -> None:
    """Every step, then a last write on every stream: the same bytes, memo or none."""
    shared, alone = World(share=True, sotw=sotw), World(share=False, sotw=sotw)
    for step in [*plan, *(("write", number) for number in range(4))]:
        shared.step(step)
        alone.step(step)
        assert shared.wire == alone.wire


def test_streams_that_subscribe_alike_share_one_answer_and_its_bytes() -> None:
    world = World(share=True)
    for number in range(4):
        world.step(("request", number, EDS, ["a", "b", "x"], [], {}, False))
        world.step(("write", number))
    assert len(set(world.wire)) == 1, "the same nonce, the same bytes: one encoding"
    assert len({id(data) for data in world.wire}) == 1, "and one object for every stream"
    (memo,) = world.view.memos.values()
    assert len(memo.answers) == 1


def test_a_change_to_the_type_starts_its_memo_afresh() -> None:
    world = World(share=True)
    world.step(("request", 0, EDS, ["a"], [], {}, False))
    world.step(("write", 0))
    world.step(("change", EDS, "a", True))
    world.step(("request", 1, EDS, ["a"], [], {}, False))
    world.step(("write", 1))
    older, newer = world.wire
    assert older != newer, "the second stream gets the assignment as it is now"


def test_a_proxy_with_an_overlay_reads_its_own_answer_and_lays_no_reset_on_others() -> None:
    """Through the real cache: a sidecar whose inbound clusters lie over the shared ones
    gets them in its first answer; the others keep sharing theirs, laid overlay or not."""
    cache = ResourceCache()
    cache.update(CDS, [Resource.from_payload(CDS, n, n.encode()) for n in ("a", "b")])
    cache.update(CDS, [Resource.from_payload(CDS, "inbound|80||", b"in")], flavor="shape")
    sidecar, other = ProxyKey("sidecar-1", None), ProxyKey("router-1", None)

    def first_answer(proxy: ProxyKey) -> tuple[list[str], bytes]:
        stream = DeltaStream()
        stream.on_request(DeltaRequest(CDS, subscribe=("*",)))
        (response,) = stream.take_responses(cache.view(owner=proxy))
        return [r.name for r in response.resources], convert.encode(response)

    names, before = first_answer(other)
    assert names == ["a", "b"]
    memo = cache._answers[CDS]
    assert cache.set_overlay(sidecar, CDS, "shape")
    assert first_answer(sidecar)[0] == ["a", "b", "inbound|80||"]
    names, after = first_answer(other)
    assert names == ["a", "b"]
    assert after != before, "the type's version rose: another version_info, new bytes"
    assert cache._answers[CDS] is memo, "laying an overlay changed no table: memo kept"
    assert len(memo.answers) == 2, "one answer per table read"
