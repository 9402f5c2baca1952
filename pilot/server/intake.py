"""What a request must be before the protocol machine sees it.

Bytes off the wire are checked against the size limit, then decoded (a
message that does not decode breaks the protocol: INVALID_ARGUMENT, one log
line); a stream's node must fit its limit (it is kept while the stream lives);
and no request may take a stream past the limit of names per type. Nothing
here keeps state: the stream's own machine says what it already holds.
"""

from __future__ import annotations

from typing import Any

from envoy.service.discovery.v3 import discovery_pb2

from pilot.decoding import BadRequest, decode
from pilot.limits import LimitExceeded, Limits
from pilot.protocol import ProtocolError
from pilot.protocol.messages import DeltaRequest, SotwRequest
from pilot.protocol.stream import StreamCore
from pilot.xds import types


def decode_request(data: bytes, delta: bool, limits: Limits) -> Any:
    """A DiscoveryRequest or DeltaDiscoveryRequest from the wire, within the size limit."""
    if len(data) > limits.request_bytes:
        raise LimitExceeded(
            "request_bytes",
            f"a request of {len(data)} bytes, more than {limits.request_bytes}"
            " (PILOT_MAX_REQUEST_BYTES)",
        )
    message_class = discovery_pb2.DeltaDiscoveryRequest if delta else discovery_pb2.DiscoveryRequest
    try:
        return decode(message_class, data)
    except BadRequest as error:
        raise ProtocolError(str(error)) from error


def check_node(node: Any, limits: Limits) -> None:
    """The node a stream identifies with, kept for its lifetime, must fit the limit."""
    size = node.ByteSize()
    if size > limits.node_bytes:
        raise LimitExceeded(
            "node_bytes",
            f"a node of {size} bytes, more than {limits.node_bytes} (PILOT_MAX_NODE_BYTES)",
        )


def check_names(stream: StreamCore, request: SotwRequest | DeltaRequest, limits: Limits) -> None:
    """After this request the stream would not subscribe to more names than the limit."""
    if isinstance(request, SotwRequest):
        count = len(set(request.resource_names))
    else:
        state = stream.state(request.type_url)
        held = state.subscription.names if state is not None else set()
        count = len(held) + len(request.subscribe)
        if count > limits.resource_names:
            count = len(held | set(request.subscribe))
    if count > limits.resource_names:
        raise LimitExceeded(
            "resource_names",
            f"subscribing to {count} {types.short_name(request.type_url)} names, more than"
            f" {limits.resource_names} (PILOT_MAX_RESOURCE_NAMES)",
        )
