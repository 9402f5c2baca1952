"""Sans-I/O xDS protocol: subscription rules and per-stream state machines.

Nothing here does I/O, touches grpc or asyncio: requests go in as small frozen
values, decisions (events, responses to send) come out. The gRPC shell in
`pilot.server` feeds these machines and writes what they return.
"""

from pilot.protocol.delta import DeltaStream
from pilot.protocol.messages import (
    Acked,
    DeltaRequest,
    DeltaResponse,
    Nacked,
    ProtocolError,
    ResourceView,
    SotwRequest,
    SotwResponse,
    StaleNonce,
    StreamEvent,
    SubscriptionChanged,
    WildcardRefused,
)
from pilot.protocol.sotw import SotwStream

__all__ = [
    "Acked",
    "DeltaRequest",
    "DeltaResponse",
    "DeltaStream",
    "Nacked",
    "ProtocolError",
    "ResourceView",
    "SotwRequest",
    "SotwResponse",
    "SotwStream",
    "StaleNonce",
    "StreamEvent",
    "SubscriptionChanged",
    "WildcardRefused",
]
