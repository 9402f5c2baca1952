"""Rules of the sans-I/O core beyond one stream: which RPC carries which type,
what a wildcard on secrets gets, and what a CDS-only stream's reply obliges
its proxy's EDS-only streams to do."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pilot.protocol import DeltaStream, ProtocolError, SotwStream, WildcardRefused
from pilot.protocol.kind import StreamKind
from pilot.protocol.messages import DeltaRequest, SotwRequest, StreamEvent
from pilot.protocol.node import streams_to_wake
from pilot.xds import types
from pilot.xds.flavor import Flavor
from tests.unit.views import FakeView

CDS_ONLY = StreamKind(False, types.CLUSTER, Flavor.GRPC)
EDS_ONLY = StreamKind(False, types.ENDPOINT, Flavor.GRPC)
ADS = StreamKind(False, None, Flavor.ADS)


@dataclass
class Side:
    """A stream of a proxy: its RPC and its machine."""

    kind: StreamKind
    stream: SotwStream


def test_a_fixed_type_service_carries_only_its_type() -> None:
    CDS_ONLY.check(types.CLUSTER)
    ADS.check(types.SECRET)
    with pytest.raises(ProtocolError, match="not served on the cds service"):
        CDS_ONLY.check(types.ENDPOINT)


def test_a_secret_wildcard_is_refused_and_answered_with_nothing() -> None:
    view = FakeView()
    view.put(types.SECRET, "ROOTCA", "root")
    sotw = SotwStream()
    assert WildcardRefused(types.SECRET) in sotw.on_request(SotwRequest(types.SECRET))
    assert sotw.take_responses(view) == []
    delta = DeltaStream()
    events = delta.on_request(DeltaRequest(types.SECRET, subscribe=("*",)))
    assert WildcardRefused(types.SECRET) in events
    assert delta.take_responses(view) == [], "not even an empty answer"


def _cluster_stream_that_acked(kind: StreamKind, view: FakeView) -> tuple[Side, list[StreamEvent]]:
    """A stream that asked for every cluster, got them, and ACKed: the ACK's events."""
    side = Side(kind, SotwStream())
    side.stream.on_request(SotwRequest(types.CLUSTER))
    (response,) = side.stream.take_responses(view)
    ack = SotwRequest(
        types.CLUSTER, version_info=response.version_info, response_nonce=response.nonce
    )
    return side, side.stream.on_request(ack)


def _eds_stream_that_holds(view: FakeView, name: str) -> Side:
    eds = Side(EDS_ONLY, SotwStream())
    eds.stream.on_request(SotwRequest(types.ENDPOINT, (name,)))
    eds.stream.take_responses(view)
    assert not eds.stream.has_work
    return eds


def test_a_cds_only_reply_makes_the_proxys_eds_streams_resend_unchanged_assignments() -> None:
    view = FakeView()
    view.put(types.CLUSTER, "a", "cluster a")
    view.put(types.ENDPOINT, "a", "endpoints of a")
    eds = _eds_stream_that_holds(view, "a")
    other_ads = Side(ADS, SotwStream())
    cds, events = _cluster_stream_that_acked(CDS_ONLY, view)
    siblings = [cds, eds, other_ads]
    woken = [s for event in events for s in streams_to_wake(cds, event, siblings)]
    assert woken == [eds]
    (resent,) = eds.stream.take_responses(view)
    assert [r.name for r in resent.resources] == ["a"], "the unchanged assignment, again"


def test_only_cds_only_streams_oblige_their_siblings() -> None:
    view = FakeView()
    view.put(types.CLUSTER, "a", "cluster a")
    view.put(types.ENDPOINT, "a", "endpoints of a")
    eds = _eds_stream_that_holds(view, "a")
    ads, events = _cluster_stream_that_acked(ADS, view)
    for event in events:
        assert streams_to_wake(ads, event, [ads, eds]) == []
    assert not eds.stream.has_work
