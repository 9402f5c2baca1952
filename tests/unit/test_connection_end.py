"""A stream lets go of everything however it ends, even cancelled twice in a row.

The handler of an xDS stream can be cancelled while it is already ending (the
client goes away as pilot ends its stream): the second cancellation cuts short
whatever the handler awaits. A stream that registered must still leave the
registry and the pipeline; once it did not, and stayed listed for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from pilot.protocol.kind import StreamKind
from pilot.push.pipeline import Pipeline
from pilot.server.connection import Connection, StreamContext
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import Flavor
from tests.support.envoy_process import wait_until
from tests.support.servicer_context import StubContext


class _Context(StubContext):
    """Before any request a stream writes nothing."""

    async def write(self, _data: bytes) -> None:
        raise AssertionError("nothing to write: no request was sent")


def _first_request(delta: bool) -> bytes:
    node = base_pb2.Node(id="twice-cancelled")
    if delta:
        return bytes(
            discovery_pb2.DeltaDiscoveryRequest(
                node=node, type_url=types.CLUSTER
            ).SerializeToString()
        )
    return bytes(
        discovery_pb2.DiscoveryRequest(node=node, type_url=types.CLUSTER).SerializeToString()
    )


async def _client(first: bytes) -> AsyncIterator[bytes]:
    yield first
    await asyncio.Event().wait()  # then nothing, until it goes away


@pytest.mark.parametrize("delta", [False, True])
async def test_a_stream_cancelled_twice_still_leaves_the_registry(delta: bool) -> None:
    pipeline = Pipeline(ResourceCache(), XdsStats(), [])
    pipeline.publish_initial()
    streams = StreamContext(pipeline, XdsStats())
    connection = Connection(streams, StreamKind(delta, None, Flavor.ADS), "ipv4:127.0.0.1:1")
    requests = _client(_first_request(delta))
    handler = asyncio.create_task(connection.serve(requests, _Context()))  # type: ignore[arg-type]
    await wait_until(lambda: connection.node is not None, 5, "the stream's first request")
    assert list(streams.connections) == [connection]

    handler.cancel()  # the stream ends...
    await asyncio.sleep(0)  # ...and is stopping its reader and writer
    handler.cancel()  # when the client goes away too
    with pytest.raises(asyncio.CancelledError):
        await handler
    assert list(streams.connections) == [], "the stream stayed registered"
