"""The `virtualInbound` a delta ADS stream holds, kept current, and its transports: what
the PeerAuthentication tests read a sidecar's mTLS mode from."""

from __future__ import annotations

from collections.abc import Callable

from envoy.config.listener.v3 import listener_pb2

from pilot.xds import types
from tests.support.xds_client import DeltaStream, delta_resources

TIMEOUT = 30.0
PERMISSIVE = {"tls", "raw_buffer", ""}  # the transport protocols of its chains
STRICT = {"tls", ""}


class Inbound:
    """The virtualInbound a delta ADS stream holds, kept current."""

    def __init__(self, stream: DeltaStream) -> None:
        self.stream = stream
        self.listener = listener_pb2.Listener()

    async def until(self, condition: Callable[[set[str]], bool]) -> set[str]:
        while not condition(self.transports()):
            response = await self.stream.next_response(TIMEOUT)
            held = delta_resources(response)
            if response.type_url == types.LISTENER and "virtualInbound" in held:
                self.listener = held["virtualInbound"].message
            await self.stream.ack(response)
        return self.transports()

    async def until_listener(
        self, condition: Callable[[listener_pb2.Listener], bool]
    ) -> listener_pb2.Listener:
        """Until the listener held satisfies `condition` (read as pilot sends it)."""
        while not condition(self.listener):
            response = await self.stream.next_response(TIMEOUT)
            held = delta_resources(response)
            if response.type_url == types.LISTENER and "virtualInbound" in held:
                self.listener = held["virtualInbound"].message
            await self.stream.ack(response)
        return self.listener

    def transports(self) -> set[str]:
        return {c.filter_chain_match.transport_protocol for c in self.listener.filter_chains}
