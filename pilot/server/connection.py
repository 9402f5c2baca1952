"""One xDS stream: a reader that feeds the protocol machine, and its single writer.

The stream first proves who it is (the `ProxyAuthenticator` it was given), and
on its first request becomes one of its proxy's streams (`ProxyKey`: node id
and proven identity). The reader turns each request into protocol events and
hands them to the push pipeline; the pipeline marks work on the machine and
wakes the writer. So a stream has at most one write in progress and one
merged batch of work pending: a client that stops reading holds up nobody
else and cannot grow pilot's memory.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from envoy.config.core.v3 import base_pb2

from pilot import logs
from pilot.limits import Admission, LimitExceeded
from pilot.logs import clipped
from pilot.protocol import DeltaStream, ProtocolError, SotwStream
from pilot.protocol.kind import StreamKind
from pilot.protocol.messages import (
    DeltaRequest,
    DeltaResponse,
    Nacked,
    SotwRequest,
    SotwResponse,
    StaleNonce,
    StreamEvent,
    WildcardRefused,
)
from pilot.server import convert, intake
from pilot.server.live_streams import LiveStreams
from pilot.server.pushing import Pushing
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.interception import METADATA_KEY, Interception, interception_of
from pilot.xds.locality import NOWHERE, Locality
from pilot.xds.proxy import PermissionDenied, ProxyAuthenticator, ProxyKey, Unauthenticated

log = logging.getLogger("pilot.xds")
_ids = itertools.count(1)
MAX_WARNINGS = 16  # distinct warnings one stream may cause


class StreamMetrics(Protocol):
    """What streams report as they write."""

    def written(self, type_url: str, size: int, seconds: float) -> None: ...

    def converged(self, seconds: float) -> None: ...


class _NoMetrics:
    def written(self, type_url: str, size: int, seconds: float) -> None:
        pass

    def converged(self, seconds: float) -> None:
        pass


@dataclass(frozen=True)
class StreamContext:
    """What every xDS stream of one port shares, handed in when the server is built.

    `served_types` narrows what the port serves (None: every type the pipeline
    builds); `auth` None means the port asks for no credentials.
    """

    pipeline: Pushing
    stats: XdsStats
    connections: LiveStreams[Connection] = field(default_factory=LiveStreams)
    auth: ProxyAuthenticator | None = None
    metrics: StreamMetrics = field(default_factory=_NoMetrics)
    served_types: frozenset[str] | None = None
    admission: Admission = field(default_factory=Admission.unlimited)
    requests: intake.RequestMemo = field(default_factory=intake.RequestMemo)

    @property
    def types(self) -> frozenset[str]:
        """The type URLs streams of this port are answered for."""
        built = self.pipeline.served_types
        return built if self.served_types is None else built & self.served_types


class Connection:
    """The server side of one xDS stream."""

    def __init__(self, context: StreamContext, kind: StreamKind, peer: str) -> None:
        self.id = next(_ids)
        self._context = context
        self._pipeline = context.pipeline
        self.kind = kind
        self.peer = peer
        self.node: base_pb2.Node | None = None
        self.locality = NOWHERE  # what its node declared: which endpoint variant it reads
        self.interception = Interception.REDIRECT  # its node's: which listeners it reads
        self.sidecar = False  # its node declared an interception mode: a sidecar
        self.proxy = ProxyKey(f"anonymous-{self.id}", None)
        self.stream: SotwStream | DeltaStream = kind.new_stream()
        self.pending_since: float | None = None
        self.connected_at = time.time()
        self._credential: str | None = None
        self._served = context.types
        self._wake = asyncio.Event()
        self._warned: set[str] = set()
        self._ended = False
        self._ended_by: BaseException | None = None  # what ended it, when an error did
        self._status: tuple[grpc.StatusCode, str] | None = None  # the client's, for that error
        self._reader: asyncio.Task[None] | None = None
        self._stop_waiting: Callable[[], object] | None = None  # ends a wait for readiness

    @property
    def proxy_id(self) -> str:
        return self.proxy.node_id

    @property
    def identity(self) -> str | None:
        return self.proxy.identity

    # -- called by the pipeline ----------------------------------------------

    def notify(self, type_url: str, names: Iterable[str], started: float) -> bool:
        if not self.stream.on_change(type_url, names):
            return False
        if self.pending_since is None:
            self.pending_since = started
        self._wake.set()
        return True

    def wake(self) -> None:
        self._wake.set()

    def close(self) -> None:
        """End the stream (server shutdown); Envoy reconnects, possibly elsewhere."""
        self._end(None)

    # -- the stream ----------------------------------------------------------

    async def serve(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, bytes]
    ) -> None:
        """Run the stream until the client cancels, breaks the protocol, or pilot stops.

        A client that half-closes (as grpcurl does after its last request) keeps
        receiving pushes: in gRPC, the end of requests is not the end of the call.
        """
        try:
            await self._context.admission.rate.admit()
            await self._authenticate(context)
            self._admit()
        except LimitExceeded as refused:
            self._context.admission.hits.hit(refused, f"xDS stream from {self.peer}")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(refused))
        await self._run(requests, context)
        if self._status is not None:
            await context.abort(*self._status)
        if self._ended_by is not None:
            raise self._ended_by  # no error of the client's: the handler's own

    async def _run(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, bytes]
    ) -> None:
        """Write until the stream ends, while a reader task feeds the protocol machine.

        The handler's own task is the writer: one task per stream fewer, since
        thousands may arrive at once. Whatever ends the stream (`_end`) lets go
        of it at once, even while a write is in gRPC's hands. That write is let
        land, as cancelling it would not take it back from gRPC, and gRPC refuses
        a status while a write is in flight.
        """
        named = f"stream-{self.id}"  # as /debug/connections and /debug/tasks show it
        current = asyncio.current_task()
        if current is not None:
            current.set_name(f"{named}-writer")
        self._reader = asyncio.create_task(self._read(requests), name=f"{named}-reader")
        self._reader.add_done_callback(self._read_ended)
        try:
            await self._write(context)
        except Exception:
            if not self._ended:
                raise  # pilot's fault or gRPC's, not the stream's: the handler's error
            # The write let land after the stream ended failed: its client is gone.
        finally:
            self._end(None)

    def _read_ended(self, reader: asyncio.Task[None]) -> None:
        """A reader that failed ends the stream; one that ended cleanly (half-close) does not."""
        if not reader.cancelled() and reader.exception() is not None:
            self._end(reader.exception())

    def _end(self, error: BaseException | None) -> None:
        """End the stream, for `error` if one ended it: let go of all it holds, now.

        Nothing here awaits: a second cancellation (the client going away while
        the stream ends) cannot cut it short, so the stream never stays
        registered, and subscribed, forever. The first cause of an end wins.
        """
        if self._ended:
            return
        self._ended, self._ended_by = True, error
        self._status = self._ending(error) if error is not None else None
        if self._reader is not None:
            self._reader.cancel()
        if self._stop_waiting is not None:
            self._stop_waiting()
        self._wake.set()  # the writer returns once its write, if any, has landed
        self._context.connections.discard(self)
        self._pipeline.leave(self)
        logs.info(log, "proxy %s disconnected (%s, %s)", self.proxy, self.kind.label, self.peer)

    def _admit(self) -> None:
        """Join the registry if the stream limits allow (no await: check and add at once)."""
        limits, connections = self._context.admission.limits, self._context.connections
        if len(connections) >= limits.streams:
            raise LimitExceeded(
                "streams", f"pilot serves {limits.streams} streams already (PILOT_MAX_STREAMS)"
            )
        if connections.on_peer(self.peer) >= limits.streams_per_connection:
            raise LimitExceeded(
                "streams_per_connection",
                f"{limits.streams_per_connection} streams on this connection already"
                " (PILOT_MAX_STREAMS_PER_CONNECTION)",
            )
        connections.add(self)

    def _ending(self, error: BaseException) -> tuple[grpc.StatusCode, str] | None:
        """What ended the stream, logged now, as its status; None for an unexpected error."""
        if isinstance(error, LimitExceeded):
            self._context.admission.hits.hit(error, f"proxy {self.proxy} ({self.peer})")
            return grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)
        if isinstance(error, ProtocolError):
            log.warning("proxy %s (%s): %s", self.proxy, self.peer, error)
            return grpc.StatusCode.INVALID_ARGUMENT, str(error)
        if isinstance(error, PermissionDenied):
            log.warning("proxy %s (%s) refused: %s", self.proxy, self.peer, error)
            return grpc.StatusCode.PERMISSION_DENIED, str(error)
        if isinstance(error, TimeoutError):
            message = "not reading its responses: closing the stream (PILOT_XDS_SEND_TIMEOUT)"
            log.warning("proxy %s (%s) %s", self.proxy, self.peer, message)
            return grpc.StatusCode.UNAVAILABLE, message
        return None

    async def _authenticate(self, context: grpc.aio.ServicerContext[Any, bytes]) -> None:
        """Check the stream's credentials; aborts UNAUTHENTICATED if refused."""
        auth = self._context.auth
        if auth is None:
            return
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        try:
            self._credential = await auth.credential(metadata, context.auth_context())
        except Unauthenticated as error:
            log.warning("xDS stream from %s refused: %s", self.peer, error)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(error))

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        async for data in requests:
            self._handle(data)

    def _handle(self, data: bytes) -> None:
        limits, memo, kind = self._context.admission.limits, self._context.requests, self.kind
        known = memo.get(data, kind.delta, kind.fixed_type)
        message = known[0] if known is not None else intake.decode_request(data, kind.delta, limits)
        if self.node is None:
            intake.check_node(message.node, limits)
            self._identify(message.node)
        type_url = message.type_url or kind.fixed_type or ""
        if type_url not in self._served:
            self._unserved(type_url)
            return
        kind.check(type_url)
        intake.check_names(self.stream, message, type_url, limits)
        if known is not None:
            request = known[1]
        else:
            request = self._convert(message)
            if not message.HasField("node"):  # a node's bytes are its proxy's alone: no hit
                memo.put(data, kind.delta, kind.fixed_type, (message, request))
        events = self.stream.on_request(request)
        self._note(events)
        unknown = self._pipeline.on_events(self, events)
        if unknown:
            self._unknown_names(request.type_url, unknown)
        if self.stream.owes_now(self._in_the_making):
            self._wake.set()  # not for a secret still being minted: its mint wakes the stream

    def _in_the_making(self, type_url: str, name: str) -> bool:
        return self._pipeline.in_the_making(type_url, name, self.proxy)

    def _convert(self, message: Any) -> SotwRequest | DeltaRequest:
        default_type = self.kind.fixed_type or ""
        if self.kind.delta:
            return convert.delta_request(message, default_type)
        return convert.sotw_request(message, default_type)

    def _identify(self, node: base_pb2.Node) -> None:
        """The first request: who the stream speaks for (node id and proven identity)."""
        self.node = node
        self.locality = Locality(node.locality.region, node.locality.zone)
        declared = node.metadata.fields.get(METADATA_KEY)
        self.interception = interception_of(declared.string_value if declared else "")
        self.sidecar = declared is not None
        auth = self._context.auth
        identity = auth.identity_of(node, self._credential) if auth is not None else None
        self.proxy = ProxyKey(node.id or self.proxy.node_id, identity)
        self._pipeline.join(self)
        logs.info(log, "proxy %s connected (%s, %s)", self.proxy, self.kind.label, self.peer)

    def _note(self, events: Iterable[StreamEvent]) -> None:
        """Logs and counters for what the client said."""
        stats = self._context.stats
        for event in events:
            if isinstance(event, Nacked):
                stats.nacks[event.type_url] += 1
                log.warning(
                    "proxy %s rejected %s version %s (nonce %s%s): %s",
                    self.proxy,
                    types.short_name(event.type_url),
                    event.rejected_version,
                    clipped(event.nonce),
                    f"; {len(event.blamed)} named, the others applied" if event.partial else "",
                    clipped(event.message, 1000),
                )
            elif isinstance(event, StaleNonce):
                stats.stale_nonces[event.type_url] += 1
            elif isinstance(event, WildcardRefused):
                self._warn_once(
                    f"wildcard {event.type_url}",
                    "proxy %s asked for every %s with a wildcard; secrets are served by name"
                    " only: ignoring it",
                    types.short_name(event.type_url),
                )

    def _unknown_names(self, type_url: str, names: list[str]) -> None:
        """One line per stream and type, however many names (a flood is one line, not many)."""
        shown = ", ".join(repr(clipped(name, 64)) for name in names[:3])
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        self._warn_once(
            f"unknown {type_url}",
            "proxy %s asked for %d %s names that pilot does not make (%s%s); ignoring them",
            len(names),
            types.short_name(type_url),
            shown,
            more,
        )

    def _unserved(self, type_url: str) -> None:
        if not type_url:
            raise ProtocolError("type_url is empty")
        self._warn_once(
            type_url,
            "proxy %s asked for %s, which pilot does not serve on this port; ignoring",
            clipped(type_url),
        )

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        """One warning per stream and subject, however often the client repeats itself.

        A stream gets at most MAX_WARNINGS subjects: a client inventing new ones
        (type URLs, say) stops being heard, it does not fill the log.
        """
        if key in self._warned or len(self._warned) >= MAX_WARNINGS:
            return
        self._warned.add(key)
        log.warning(message, self.proxy, *args)

    async def _write(self, context: grpc.aio.ServicerContext[Any, bytes]) -> None:
        """Send what the stream owes whenever it is woken, until it ends."""
        pipeline = self._pipeline
        await self._until_ready()
        while not self._ended:
            await self._wake.wait()
            async with pipeline.push_slot():
                if self._ended:
                    return
                self._wake.clear()
                since, self.pending_since = self.pending_since, None
                for response in self.stream.take_responses(pipeline.view(self)):
                    await self._send(context, response)
                    if self._ended:
                        return  # the write that was in flight has landed: nothing more
                if since is not None:
                    self._context.metrics.converged(time.monotonic() - since)

    async def _until_ready(self) -> None:
        """A stream that arrives before the initial state waits for it, or for its end."""
        ready = self._pipeline.ready
        if ready.is_set():
            return
        waiting = asyncio.ensure_future(ready.wait())
        self._stop_waiting = waiting.cancel
        try:
            await asyncio.wait([waiting])  # returns, not raises, when `_end` cancels it
        finally:
            waiting.cancel()
            self._stop_waiting = None

    def _time_out(self) -> None:
        """A write outlived the send timeout: end the stream (`_ending` says why)."""
        self._end(TimeoutError())

    async def _send(
        self,
        context: grpc.aio.ServicerContext[Any, bytes],
        response: SotwResponse | DeltaResponse,
    ) -> None:
        started = time.monotonic()
        data = convert.encode(response)
        with self._pipeline.writing(self, self._time_out):
            await context.write(data)
        self._context.stats.responses[response.type_url] += 1
        self._context.metrics.written(response.type_url, len(data), time.monotonic() - started)
