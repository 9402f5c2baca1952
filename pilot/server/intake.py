"""What a request must be before the protocol machine sees it.

Bytes off the wire are checked against the size limit, then decoded (a
message that does not decode breaks the protocol: INVALID_ARGUMENT, one log
line); a stream's node must fit its limit (it is kept while the stream lives);
and no request may take a stream past the limit of names per type. Nothing
here keeps per-stream state: the stream's own machine says what it already
holds.

`RequestMemo` remembers recent requests byte for byte: the Envoys of one mesh
send the same requests (a restart's thousand proxies ask for the same
thousand assignments, and ACK the same nonces), so each is decoded and
converted once. A request is never remembered before it has passed every check
a new one goes through, and the checks that depend on the stream run every time.
A request that names its node (a stream's first) is never remembered: no other
stream sends those bytes, and a storm of them would push out the ones shared.
"""

from __future__ import annotations

from collections import OrderedDict
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


MEMO_REQUESTS = 256  # requests remembered at once
MEMO_BYTES = 8 << 20  # and their bytes, at most


class RequestMemo:
    """Recent requests by their bytes (and the kind of stream they came on): the decoded
    message and what the protocol machine was handed. Oldest out first."""

    def __init__(self, requests: int = MEMO_REQUESTS, size: int = MEMO_BYTES) -> None:
        self._held: OrderedDict[tuple[bytes, bool, str | None], tuple[Any, Any]] = OrderedDict()
        self._room = (requests, size)
        self._bytes = 0

    def get(self, data: bytes, delta: bool, fixed_type: str | None) -> tuple[Any, Any] | None:
        """(message, converted request) of an equal request seen lately, or None."""
        return self._held.get((data, delta, fixed_type))

    def put(
        self, data: bytes, delta: bool, fixed_type: str | None, decoded: tuple[Any, Any]
    ) -> None:
        """Remember a request that passed its checks (too large for the memo: not at all)."""
        requests, size = self._room
        if len(data) > size // 4:
            return
        key = (data, delta, fixed_type)
        if key in self._held:
            return
        while self._held and (len(self._held) >= requests or self._bytes + len(data) > size):
            (old, _, _), _ = self._held.popitem(last=False)
            self._bytes -= len(old)
        self._held[key] = decoded
        self._bytes += len(data)
