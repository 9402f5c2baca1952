"""One xDS stream: a reader that feeds the protocol machine, and its single writer.

The reader turns each request into protocol events (ACK, NACK, subscription
changes) and wakes the writer when the machine owes responses. Pushes only mark
work on the machine and wake the writer, so a stream has at most one write in
progress and one merged batch of work pending: a client that stops reading
holds up nobody else and cannot grow pilot's memory.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2

from pilot.generators.cds import Flavor
from pilot.protocol import DeltaStream, ProtocolError, SotwStream
from pilot.protocol.messages import DeltaRequest, DeltaResponse, SotwRequest, SotwResponse
from pilot.security.authn import AuthError
from pilot.security.identity import Identity
from pilot.security.xds_auth import IdentityMismatch
from pilot.server import convert
from pilot.server.hub import XdsHub
from pilot.xds import types

log = logging.getLogger("pilot.xds")
_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class StreamKind:
    """Which RPC a stream came in on."""

    delta: bool
    fixed_type: str | None  # None: aggregated (ADS), any type
    flavor: Flavor

    @property
    def label(self) -> str:
        base = "ads" if self.fixed_type is None else types.short_name(self.fixed_type)
        return f"{base}-delta" if self.delta else base


class Connection:
    """The server side of one xDS stream."""

    def __init__(self, hub: XdsHub, kind: StreamKind, peer: str) -> None:
        self.id = next(_ids)
        self.hub = hub
        self.kind = kind
        self.peer = peer
        self.node: base_pb2.Node | None = None
        self.proxy_id = f"anonymous-{self.id}"
        self.credential: Identity | None = None
        self.identity: Identity | None = None
        self.stream: SotwStream | DeltaStream = DeltaStream() if kind.delta else SotwStream()
        self.pending_since: float | None = None
        self.connected_at = time.time()
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._warned_types: set[str] = set()

    # -- called by the hub ---------------------------------------------------

    def notify(self, type_url: str, names: Iterable[str], started: float) -> bool:
        if not self.stream.on_change(type_url, names):
            return False
        if self.pending_since is None:
            self.pending_since = started
        self._wake.set()
        return True

    def force(self, type_url: str, names: Iterable[str]) -> None:
        if self.stream.force(type_url, names):
            self._wake.set()

    def close(self) -> None:
        """End the stream (server shutdown); Envoy reconnects, possibly elsewhere."""
        self._closing.set()

    def held(self, type_url: str) -> list[str]:
        state = self.stream.state(type_url)
        return list(state.sent) if state else []

    def subscriptions(self) -> list[tuple[str, set[str]]]:
        found = []
        for type_url in self.stream.type_urls():
            state = self.stream.state(type_url)
            if state is not None:
                found.append((type_url, state.subscription.names))
        return found

    # -- the stream ----------------------------------------------------------

    async def serve(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, bytes]
    ) -> None:
        """Run the stream until the client cancels, breaks the protocol, or pilot stops.

        A client that half-closes (as grpcurl does after its last request) keeps
        receiving pushes: in gRPC, the end of requests is not the end of the call.
        """
        await self._authenticate(context)
        self.hub.connect(self)
        reader = asyncio.create_task(self._read(requests))
        writer = asyncio.create_task(self._write(context))
        closing = asyncio.create_task(self._closing.wait())
        try:
            running = {reader, writer, closing}
            while True:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    await self._end_on_error(task, context)
                if writer in done or closing in done:
                    return  # a reader that ended cleanly (half-close) ends nothing
        finally:
            for task in (reader, writer, closing):
                task.cancel()
            await asyncio.gather(reader, writer, closing, return_exceptions=True)
            self.hub.disconnect(self)
            log.info("proxy %s disconnected (%s, %s)", self.proxy_id, self.kind.label, self.peer)

    async def _end_on_error(
        self, task: asyncio.Task[Any], context: grpc.aio.ServicerContext[Any, bytes]
    ) -> None:
        """Turn what ended a task into the stream's status."""
        error = task.exception()
        if isinstance(error, ProtocolError):
            log.warning("proxy %s (%s): %s", self.proxy_id, self.peer, error)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        elif isinstance(error, IdentityMismatch):
            log.warning("proxy %s (%s) refused: %s", self.proxy_id, self.peer, error)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(error))
        elif isinstance(error, TimeoutError):
            message = "not reading its responses: closing the stream (PILOT_XDS_SEND_TIMEOUT)"
            log.warning("proxy %s (%s) %s", self.proxy_id, self.peer, message)
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        elif error is not None:
            raise error

    async def _authenticate(self, context: grpc.aio.ServicerContext[Any, bytes]) -> None:
        """Check the stream's credentials (with --xds-auth kubernetes); aborts if refused."""
        identities = self.hub.identities
        if identities is None:
            return
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        try:
            self.credential = await identities.from_credentials(metadata)
        except AuthError as error:
            log.warning("xDS stream from %s refused: %s", self.peer, error)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(error))

    async def _read(self, requests: AsyncIterator[Any]) -> None:
        async for message in requests:
            self._handle(message)

    def _handle(self, message: Any) -> None:
        if self.node is None:
            self._identify(message.node)
        request = self._convert(message)
        if request.type_url not in self.hub.served_types:
            self._unserved(request.type_url)
            return
        if self.kind.fixed_type is not None and request.type_url != self.kind.fixed_type:
            raise ProtocolError(
                f"type_url {request.type_url} is not served on the {self.kind.label} service"
            )
        for event in self.stream.on_request(request):  # type: ignore[arg-type]
            self.hub.on_event(self, event)
        if self.stream.has_work:
            self._wake.set()

    def _convert(self, message: Any) -> SotwRequest | DeltaRequest:
        default_type = self.kind.fixed_type or ""
        if self.kind.delta:
            return convert.delta_request(message, default_type)
        return convert.sotw_request(message, default_type)

    def _identify(self, node: base_pb2.Node) -> None:
        self.node = node
        if node.id:
            self.proxy_id = node.id
        if self.hub.identities is not None:
            self.identity = self.hub.identities.for_node(node, self.credential)
        self.hub.identify(self)
        log.info("proxy %s connected (%s, %s)", self.proxy_id, self.kind.label, self.peer)

    def _unserved(self, type_url: str) -> None:
        if not type_url:
            raise ProtocolError("type_url is empty")
        if type_url not in self._warned_types:
            self._warned_types.add(type_url)
            log.warning(
                "proxy %s asked for %s, which pilot does not serve; ignoring",
                self.proxy_id,
                type_url,
            )

    async def _write(self, context: grpc.aio.ServicerContext[Any, bytes]) -> None:
        timeout = self.hub.push_settings.send_timeout or None
        await self.hub.ready.wait()
        while True:
            await self._wake.wait()
            async with self.hub.push_slots:
                self._wake.clear()
                since, self.pending_since = self.pending_since, None
                for response in self.stream.take_responses(self.hub.view(self)):
                    async with asyncio.timeout(timeout):
                        await self._send(context, response)
                if since is not None and self.hub.metrics is not None:
                    self.hub.metrics.convergence.observe(time.monotonic() - since)

    async def _send(
        self,
        context: grpc.aio.ServicerContext[Any, bytes],
        response: SotwResponse | DeltaResponse,
    ) -> None:
        started = time.monotonic()
        data = convert.encode(response)
        await context.write(data)
        self.hub.stats.responses[response.type_url] += 1
        metrics = self.hub.metrics
        if metrics is not None:
            short = types.short_name(response.type_url)
            metrics.push_time.labels(short).observe(time.monotonic() - started)
            metrics.config_size.labels(short).observe(len(data))
