"""The request memo keeps what streams send alike, not what names one proxy.

A stream's first request names its node, so no other stream sends those bytes:
a storm of arrivals must not push the requests that streams do share (their
next subscriptions, their ACKs) out of the memo, nor cost a place in it each.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from pilot.protocol.kind import StreamKind
from pilot.push.pipeline import Pipeline
from pilot.push.request import Changes, PushRequest
from pilot.server.connection import Connection, StreamContext
from pilot.server.intake import RequestMemo
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import Flavor
from tests.support.envoy_process import wait_until
from tests.support.servicer_context import StubContext

DELTA_ADS = StreamKind(True, None, Flavor.ADS)
ARRIVALS = 12  # three times what the memo holds


class _Clusters:
    """A generator of no clusters: enough for streams to ask for them."""

    type_urls = frozenset({types.CLUSTER, types.ENDPOINT})

    def build(self, request: PushRequest) -> Changes:
        return Changes()


def _request(node_id: str | None, type_url: str) -> bytes:
    node = base_pb2.Node(id=node_id) if node_id is not None else None
    return bytes(
        discovery_pb2.DeltaDiscoveryRequest(
            node=node, type_url=type_url, resource_names_subscribe=["outbound|80||a"]
        ).SerializeToString()
    )


async def _client(sent: list[bytes], handled: asyncio.Event) -> AsyncIterator[bytes]:
    for request in sent:
        yield request
    handled.set()
    await asyncio.Event().wait()  # then nothing, until it goes away


async def test_first_requests_take_no_place_from_the_requests_streams_share() -> None:
    pipeline = Pipeline(ResourceCache(), XdsStats(), [_Clusters()])
    pipeline.publish_initial()
    memo = RequestMemo(requests=ARRIVALS // 3)
    streams = StreamContext(pipeline, XdsStats(), requests=memo)
    shared = _request(None, types.ENDPOINT)  # what every proxy asks next, alike
    firsts = [
        _request(f"sidecar~198.18.0.{i}~p-{i}.ns~ns.svc", types.CLUSTER) for i in range(ARRIVALS)
    ]
    handled = [asyncio.Event() for _ in firsts]
    handlers = []
    for i, (first, done) in enumerate(zip(firsts, handled, strict=True)):
        connection = Connection(streams, DELTA_ADS, f"ipv4:198.18.0.{i}:1")
        requests = _client([first, shared] if i == 0 else [first], done)
        handlers.append(asyncio.create_task(connection.serve(requests, StubContext())))  # type: ignore[arg-type]
        await wait_until(done.is_set, 5, f"stream {i}'s requests handled")
    try:
        assert memo.get(shared, True, None) is not None, "the shared request was pushed out"
        assert all(memo.get(first, True, None) is None for first in firsts)
    finally:
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
