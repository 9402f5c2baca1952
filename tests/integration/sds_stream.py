"""`SecretStream`: an SDS client for the SDS tests, as Envoy uses the protocol.

Owns one real gRPC stream to pilot, SotW or delta, over ADS or the
SecretDiscoveryService, that requests secrets by name and ACKs what it
receives; each response is decoded into an `Update` whose repr names its
secrets and never shows their contents. `SdsClient` / `sds_channel`: a channel
and the streams opened on it, all closed together.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeAlias, cast

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2

from tests.integration.sds_secrets import (
    ROOT,
    SECRET_TYPE,
    WORKLOAD,
    WorkloadCert,
    decode_secret,
    root_of,
    workload_cert,
)

ADS_METHODS = {
    False: "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
    True: "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
}
SDS_METHODS = {
    False: "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets",
    True: "/envoy.service.secret.v3.SecretDiscoveryService/DeltaSecrets",
}
RESPONSE_TIMEOUT = 10.0

# The protobuf classes are untyped (Any) for mypy: aliases, not annotations.
DiscoveryRequest: TypeAlias = discovery_pb2.DiscoveryRequest
DiscoveryResponse: TypeAlias = discovery_pb2.DiscoveryResponse
DeltaRequest: TypeAlias = discovery_pb2.DeltaDiscoveryRequest
DeltaResponse: TypeAlias = discovery_pb2.DeltaDiscoveryResponse
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # grpc-stubs lack it


@dataclass
class Update:
    """One response's secrets; its repr names them and never shows their contents."""

    nonce: str
    secrets: dict[str, secret_pb2.Secret] = field(repr=False)
    removed: tuple[str, ...] = ()
    version: str = ""  # SotW version_info

    @property
    def names(self) -> list[str]:
        return sorted(self.secrets)

    def __repr__(self) -> str:
        return f"Update(nonce={self.nonce}, names={self.names}, removed={list(self.removed)})"

    @property
    def workload(self) -> WorkloadCert:
        assert WORKLOAD in self.secrets, f"{self!r} has no {WORKLOAD!r}"
        return workload_cert(self.secrets[WORKLOAD])

    @property
    def root_pem(self) -> str:
        assert ROOT in self.secrets, f"{self!r} has no {ROOT!r}"
        return root_of(self.secrets[ROOT])


@dataclass(frozen=True)
class Ended:
    """The stream ended (from the server's side, or because we cancelled it)."""

    code: grpc.StatusCode
    details: str


@dataclass(frozen=True)
class Malformed:
    """A response no Envoy would accept; reading stopped there."""

    reason: str


class SecretStream:
    """One xDS stream for secrets, as Envoy uses it: requests names, ACKs every response.

    `service` is "ads" (Stream/DeltaAggregatedResources) or "sds" (the
    SecretDiscoveryService); the node goes on the first request only.
    """

    def __init__(
        self, channel: grpc.aio.Channel, node: base_pb2.Node, *, service: str, delta: bool
    ) -> None:
        methods = ADS_METHODS if service == "ads" else SDS_METHODS
        request_type = DeltaRequest if delta else DiscoveryRequest
        response_type = DeltaResponse if delta else DiscoveryResponse
        self.label = f"{service}{'-delta' if delta else ''} {node.id}"
        self.delta = delta
        self._node = node
        self._call: Any = cast(Any, channel.stream_stream)(
            methods[delta],
            request_serializer=request_type.SerializeToString,
            response_deserializer=response_type.FromString,
        )()
        self._first = True
        self.names: list[str] = []  # SotW: the current full list
        self._version = ""
        self._nonce = ""
        self.updates: list[Update] = []
        self._queue: asyncio.Queue[Update | Ended | Malformed] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read(), name=f"read {self.label}")

    async def _read(self) -> None:
        try:
            while True:
                message = await self._call.read()
                if message is _EOF:
                    self._queue.put_nowait(Ended(grpc.StatusCode.OK, "stream ended"))
                    return
                self._queue.put_nowait(self._decode(message))
        except grpc.aio.AioRpcError as error:
            self._queue.put_nowait(Ended(error.code(), error.details() or ""))
        except AssertionError as error:
            self._queue.put_nowait(Malformed(str(error)))

    def _decode(self, message: DiscoveryResponse | DeltaResponse) -> Update:
        assert message.type_url == SECRET_TYPE, f"{self.label}: got a {message.type_url} response"
        assert message.nonce, f"{self.label}: a response without nonce"
        if self.delta:
            secrets = {r.name: decode_secret(r.resource) for r in message.resources}
            for resource in message.resources:
                assert secrets[resource.name].name == resource.name, "Resource.name mismatch"
            return Update(message.nonce, secrets, tuple(message.removed_resources))
        decoded = [decode_secret(r) for r in message.resources]
        names = [secret.name for secret in decoded]
        assert len(set(names)) == len(names), f"{self.label}: a name twice in {names}"
        return Update(message.nonce, {s.name: s for s in decoded}, version=message.version_info)

    async def _send(self, request: DiscoveryRequest | DeltaRequest) -> None:
        request.type_url = SECRET_TYPE
        if self._first:
            request.node.CopyFrom(self._node)
            self._first = False
        await self._call.write(request)

    async def subscribe(self, names: Iterable[str]) -> None:
        """SotW: add to the full list and send it; delta: `resource_names_subscribe`."""
        names = list(names)
        if self.delta:
            await self._send(DeltaRequest(resource_names_subscribe=names))
            return
        self.names += [n for n in names if n not in self.names]
        await self._send_sotw()

    async def unsubscribe(self, names: Iterable[str]) -> None:
        """SotW: send the list without them (possibly empty); delta: unsubscribe."""
        names = list(names)
        if self.delta:
            await self._send(DeltaRequest(resource_names_unsubscribe=names))
            return
        self.names = [n for n in self.names if n not in names]
        await self._send_sotw()

    async def resend(self) -> None:
        """SotW: send the same list again (a re-request while subscribed)."""
        await self._send_sotw()

    async def _send_sotw(self) -> None:
        await self._send(
            DiscoveryRequest(
                resource_names=self.names, version_info=self._version, response_nonce=self._nonce
            )
        )

    async def _ack(self, update: Update) -> None:
        if self.delta:
            await self._send(DeltaRequest(response_nonce=update.nonce))
        else:
            self._nonce, self._version = update.nonce, update.version
            await self._send_sotw()

    async def next_update(self, timeout: float = RESPONSE_TIMEOUT) -> Update:  # noqa: ASYNC109
        """The next response, ACKed; fails if none comes in time or the stream ended."""
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            raise AssertionError(
                f"{self.label}: no response within {timeout}s; earlier: {self.updates[-3:]}"
            ) from None
        if isinstance(item, Ended):
            raise AssertionError(f"{self.label}: stream ended: {item.code.name} {item.details}")
        if isinstance(item, Malformed):
            raise AssertionError(f"{self.label}: malformed response: {item.reason}")
        self.updates.append(item)
        await self._ack(item)
        return item

    async def wait_for(self, name: str, timeout: float = RESPONSE_TIMEOUT) -> Update:  # noqa: ASYNC109
        """Read (and ACK) responses until one carries `name`."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            update = await self.next_update(max(remaining, 0.0))
            if name in update.secrets:
                return update

    async def expect_silence(self, seconds: float) -> None:
        """Assert that nothing at all arrives for `seconds` (the stream stays open)."""
        try:
            item = await asyncio.wait_for(self._queue.get(), seconds)
        except TimeoutError:
            return
        raise AssertionError(f"{self.label}: expected no response for {seconds}s, got {item!r}")

    async def close(self) -> None:
        """Cancel the call, as an Envoy that goes away does."""
        self._call.cancel()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@asynccontextmanager
async def sds_channel(target: str) -> AsyncIterator[SdsClient]:
    client = SdsClient(grpc.aio.insecure_channel(target))
    try:
        yield client
    finally:
        await client.aclose()


@dataclass
class SdsClient:
    """A channel to pilot and the secret streams opened on it (all closed on exit)."""

    channel: grpc.aio.Channel
    streams: list[SecretStream] = field(default_factory=list)

    def stream(
        self, node: base_pb2.Node, *, service: str = "ads", delta: bool = False
    ) -> SecretStream:
        stream = SecretStream(self.channel, node, service=service, delta=delta)
        self.streams.append(stream)
        return stream

    async def aclose(self) -> None:
        for stream in self.streams:
            await stream.close()
        await self.channel.close(None)
