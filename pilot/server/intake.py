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


def check_names(stream: StreamCore, message: Any, type_url: str, limits: Limits) -> None:
    """After this request the stream would not subscribe to more names than the limit.

    Counted on the message as it came (before any name is copied or interned), so
    that a request naming a million names costs pilot no more than its decoding.
    """
    if isinstance(message, discovery_pb2.DeltaDiscoveryRequest):
        state = stream.state(type_url)
        held = len(state.subscription.names) if state is not None else 0
        count = held + len(message.resource_names_subscribe)
    else:
        count = len(message.resource_names)
    if count > limits.resource_names:
        raise LimitExceeded(
            "resource_names",
            f"subscribing to {count} {types.short_name(type_url)} names, more than"
            f" {limits.resource_names} (PILOT_MAX_RESOURCE_NAMES)",
        )
