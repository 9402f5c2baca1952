"""New streams that arrive faster than pilot's event loop picks them up: a reconnect storm.

gRPC core queues each new stream until grpc.aio's loop asks for it. Its own
default drops streams at random past 1,000 queued; pilot lets as many wait as
its stream limit (PILOT_MAX_STREAMS) admits, and refuses the rest at once.

Each test holds pilot's loop (it runs in the test's loop) while a client thread
opens the streams, so they all queue; it lets the loop go only once gRPC has
refused every stream past the bound, which it can only do with the queue full.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from pilot.limits import Limits
from tests.support.mesh import simple_mesh
from tests.support.pilot import running_pilot
from tests.support.xds_client import DeltaRequest, node

ADS_DELTA_PATH = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
# Each stream on its own connection would be slow; two connections stay under
# the default PILOT_MAX_STREAMS_PER_CONNECTION (1,000) for every count here.
CHANNELS = 2
# Streams gRPC holds past the limit: those matched at once to the call requests
# grpc.aio had already made, not queued (seen: 2).
ALREADY_REQUESTED = 2
WAIT = 60.0


@dataclass
class Outcome:
    """How the streams ended: refused by gRPC while pilot's loop was held, or afterwards."""

    total: int
    refused: dict[int, grpc.StatusCode] = field(default_factory=dict)  # stream -> code
    later: list[grpc.StatusCode] = field(default_factory=list)
    served: int = 0
    held: bool = True
    settled: threading.Condition = field(default_factory=threading.Condition)

    def note(self, index: int, call: grpc.Call) -> None:
        """A stream ended: while the loop is held, gRPC refused it."""
        with self.settled:
            if self.held:
                self.refused[index] = call.code()
                self.settled.notify_all()

    def wait_refused(self, count: int) -> None:
        """Until `count` streams are refused, then stop counting (the loop goes on)."""
        with self.settled:
            assert self.settled.wait_for(lambda: len(self.refused) >= count, WAIT), (
                f"{len(self.refused)} of {self.total} streams refused, expected {count}"
            )
            self.held = False


def _subscription(index: int) -> Iterator[bytes]:
    request = DeltaRequest(
        type_url=CLUSTER, resource_names_subscribe=["*"], node=node(f"storm-{index}")
    )
    yield request.SerializeToString()
    threading.Event().wait()  # keep the stream open (half-closing would end it)


def _open(target: str, count: int, outcome: Outcome) -> list[grpc.Call]:
    """`count` delta ADS streams, each subscribing to every Cluster."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(target, options=options) for _ in range(CHANNELS)]
    calls: list[grpc.Call] = []
    for index in range(count):
        method = channels[index % CHANNELS].stream_stream(ADS_DELTA_PATH)
        call = method(_subscription(index))
        call.add_done_callback(functools.partial(outcome.note, index))
        calls.append(call)
    return calls


def _first_responses(calls: list[grpc.Call], outcome: Outcome) -> None:
    """Read the first response of each stream that waited (pilot's loop runs again)."""
    for index, call in enumerate(calls):
        if index in outcome.refused:
            continue
        try:
            next(call)  # type: ignore[call-overload]
            outcome.served += 1
        except grpc.RpcError as error:
            outcome.later.append(error.code())
        call.cancel()


async def _storm(tmp_path: Path, streams: int, limit: int) -> Outcome:
    """Open `streams` at once against a pilot that admits `limit` (no rate limit)."""
    limits = Limits(streams=limit, requests_per_second=0)
    mesh = simple_mesh({"api": ["10.0.0.1"]})
    async with running_pilot(tmp_path, mesh, limits=limits, drain_duration=0.0) as pilot:
        outcome = Outcome(streams)
        calls = _open(pilot.grpc_target, streams, outcome)
        beyond = max(0, streams - limit - ALREADY_REQUESTED)
        # Blocks this loop, pilot's, on purpose: nothing is picked up meanwhile.
        outcome.wait_refused(beyond)
        await asyncio.to_thread(_first_responses, calls, outcome)
        # Only pilot's own stream limit may refuse a stream that waited.
        assert set(outcome.later) <= {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert len(outcome.later) <= ALREADY_REQUESTED
        return outcome


@pytest.mark.asyncio
async def test_a_storm_past_grpcs_default_queue_is_served_whole(tmp_path: Path) -> None:
    # 1,300 wait for the loop: gRPC's default would have dropped some past 1,000.
    limit = 1_300
    outcome = await _storm(tmp_path, streams=1_400, limit=limit)
    assert outcome.served >= limit


@pytest.mark.asyncio
async def test_streams_past_pilots_limit_are_refused_at_once_not_queued(tmp_path: Path) -> None:
    limit = 20
    outcome = await _storm(tmp_path, streams=120, limit=limit)
    # Refused by gRPC while pilot's loop was held: the queue stops at the stream limit.
    assert len(outcome.refused) >= 120 - limit - ALREADY_REQUESTED
    assert set(outcome.refused.values()) == {grpc.StatusCode.CANCELLED}
    # What waited is served as if there had been no storm.
    assert outcome.served >= limit
