"""A stream lets go of everything however it ends, even cancelled twice in a row.

The handler of an xDS stream can be cancelled while it is already ending (the
client goes away as pilot ends its stream): the second cancellation cuts short
whatever the handler awaits. A stream that registered must still leave the
registry and the pipeline; once it did not, and stayed listed for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

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
from tests.harness.envoy_process import wait_until


class _Context:
    """The part of a grpc.aio ServicerContext a stream touches before any request."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    async def write(self, _data: bytes) -> None:
        raise AssertionError("nothing to write: no request was sent")

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted {code}: {details}")


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
