"""Rules that span the streams of one proxy (one Envoy), not one stream.

An Envoy without ADS fetches clusters and endpoints over separate streams (a
CDS-only and an EDS-only one). Envoy keeps a (re)sent cluster warming until its
ClusterLoadAssignment arrives, even an unchanged one: so once the CDS-only
stream has answered a cluster response (ACK or NACK), the proxy's EDS-only
streams must resend the assignments of the clusters it holds. ADS streams do
this within themselves (see `StreamCore._follow_clusters`).

Siblings are the streams of the same proxy (`ProxyKey`: node id *and* proven
identity), so a stream can never make another identity's streams resend.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from pilot.protocol.kind import StreamKind
from pilot.protocol.messages import Acked, Nacked, StreamEvent
from pilot.protocol.stream import StreamCore
from pilot.xds import types


class Sibling(Protocol):
    """A stream of a proxy, as these rules see it."""

    @property
    def kind(self) -> StreamKind: ...

    @property
    def stream(self) -> StreamCore: ...


S = TypeVar("S", bound=Sibling)


def streams_to_wake(replied: Sibling, event: StreamEvent, siblings: Iterable[S]) -> list[S]:
    """After `event` on `replied`, the siblings that now owe responses (work marked on them)."""
    if not isinstance(event, Acked | Nacked) or event.type_url != types.CLUSTER:
        return []
    if replied.kind.fixed_type != types.CLUSTER:
        return []  # ADS streams follow clusters with endpoints themselves, in order
    state = replied.stream.state(types.CLUSTER)
    clusters = list(state.sent) if state is not None else []
    return [
        sibling
        for sibling in siblings
        if sibling.kind.fixed_type == types.ENDPOINT
        and sibling.stream.force(types.ENDPOINT, clusters)
    ]
