"""Performing one `Call` with gRPC's blocking API, and what came of it (`Outcome`).

The blocking API is used on purpose: with grpc.aio, a write that races the server
closing the stream replaces the server's status with a local INTERNAL error, which
would hide exactly what the fuzzer looks for.

An xDS stream stays open as long as the client wants, so after its requests the
stream gets one more, the *final request*, which pilot must answer if the stream is
still healthy: on delta streams a subscription to a name that does not exist
(answered in `removed_resources`), on SotW streams a subscription to exactly one resource
not subscribed yet (answered with just it). Once it is answered every earlier request has
been handled, and the call is cancelled, as an Envoy going away does. Other streams
half-close after their requests (CSDS and reflection then end the call); Health/Watch
is cancelled after its first answer.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf.message import DecodeError

from tests.fuzz.calls import Call, XdsStep
from tests.fuzz.methods import Method, Shape
from tests.support.xds_client import CLUSTER, ENDPOINT, SECRET

DEADLINE = 3.0  # seconds for a call, or for an open xDS stream to answer its final request
ROOTCA = "ROOTCA"
_NAME_OF = {
    CLUSTER: (cluster_pb2.Cluster, lambda m: m.name),
    ENDPOINT: (endpoint_pb2.ClusterLoadAssignment, lambda m: m.cluster_name),
    SECRET: (secret_pb2.Secret, lambda m: m.name),
}
_final_ids = itertools.count(1)

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Outcome:
    """How a call ended. `code` None: pilot kept it open until the client let go."""

    code: grpc.StatusCode | None
    details: str = ""
    answers: int = 0
    answered: bool | None = None  # open xDS streams: whether the final request was answered
    bad_answer: str = ""  # an answer the client could not decode

    def __str__(self) -> str:
        if self.code is None:
            answered = {True: "answered", False: "did NOT answer", None: "-"}[self.answered]
            return f"kept open after {self.answers} answers ({answered} the final request)"
        return f"{self.code.name} {self.details!r} after {self.answers} answers"


def encode(request: Any) -> bytes:
    if isinstance(request, bytes):
        return request
    if isinstance(request, XdsStep):
        return bytes(request.message.SerializeToString())
    return bytes(request.SerializeToString())


def perform(
    channel: grpc.Channel,
    call: Call,
    metadata: Metadata | None,
    clusters: Sequence[str],
    deadline: float = DEADLINE,
) -> Outcome:
    """Send the call's requests and wait (up to `deadline` seconds) for its end, its
    first answer or its final answer."""
    method = call.method
    if method.xds_stream:
        return _XdsExchange(method, call, clusters, deadline).run(channel, metadata)
    first = encode(call.requests[0])
    if method.shape is Shape.UNARY:
        return _unary(channel, method, first, metadata, deadline)
    if method.shape is Shape.SERVER_STREAM:
        return _first_answer(channel, method, first, metadata, deadline)
    requests = [encode(r) for r in call.requests]
    return _to_the_end(channel, method, requests, metadata, deadline)


def _failed(error: grpc.RpcError, answers: int = 0) -> Outcome:
    return Outcome(error.code(), error.details() or "", answers)  # type: ignore[attr-defined]


def _unary(
    channel: grpc.Channel, method: Method, request: bytes, metadata: Any, deadline: float
) -> Outcome:
    rpc = channel.unary_unary(method.path, request_serializer=None, response_deserializer=None)
    try:
        answer = rpc(request, timeout=deadline, metadata=metadata)
    except grpc.RpcError as error:
        return _failed(error)
    return Outcome(grpc.StatusCode.OK, answers=1, bad_answer=_undecodable(method, answer))


def _first_answer(
    channel: grpc.Channel, method: Method, request: bytes, metadata: Any, deadline: float
) -> Outcome:
    rpc = channel.unary_stream(method.path, request_serializer=None, response_deserializer=None)
    responses = rpc(request, timeout=deadline, metadata=metadata)
    try:
        next(responses)
    except StopIteration:
        return Outcome(grpc.StatusCode.OK)
    except grpc.RpcError as error:
        return _failed(error)
    responses.cancel()
    return Outcome(None, answers=1, answered=True)


def _to_the_end(
    channel: grpc.Channel, method: Method, requests: list[bytes], metadata: Any, deadline: float
) -> Outcome:
    rpc = channel.stream_stream(method.path, request_serializer=None, response_deserializer=None)
    answers = 0
    try:
        for _answer in rpc(iter(requests), timeout=deadline, metadata=metadata):
            answers += 1
    except grpc.RpcError as error:
        return _failed(error, answers)
    return Outcome(grpc.StatusCode.OK, answers=answers)


def _undecodable(method: Method, answer: bytes) -> str:
    """Why an answer does not decode as the method's response ('' when it does)."""
    try:
        method.response.FromString(answer)
    except DecodeError as error:
        return f"undecodable {method.response.DESCRIPTOR.name}: {error}"
    return ""


class _XdsExchange:
    """One xDS stream: the call's requests (nonces filled in as they are sent), then the
    final request, read until it is answered, the stream ends, or DEADLINE."""

    def __init__(
        self, method: Method, call: Call, clusters: Sequence[str], deadline: float
    ) -> None:
        self.method = method
        self.deadline = deadline
        self.call = call
        self.clusters = list(clusters)
        self.nonces: dict[str, str] = {}  # type -> latest nonce received
        self.names: dict[str, list[str]] = {}  # SotW: type -> names last sent
        fixed = method.xds_types[0] if len(method.xds_types) == 1 else ""
        self._fixed_type = fixed  # what an empty type_url means on this service
        self.final_type = fixed or ENDPOINT
        self.final_name = ""
        self.final_sent = False
        self.done = threading.Event()
        self._lock = threading.Lock()

    def run(self, channel: grpc.Channel, metadata: Any) -> Outcome:
        rpc = channel.stream_stream(
            self.method.path, request_serializer=None, response_deserializer=None
        )
        responses = rpc(self._requests(), timeout=self.deadline, metadata=metadata)
        answers = 0
        try:
            for raw in responses:
                answers += 1
                answered, bad = self._read(raw)
                if bad or answered:
                    responses.cancel()
                    return Outcome(None, answers=answers, answered=answered, bad_answer=bad)
        except grpc.RpcError as error:
            if error.code() is grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                return Outcome(None, answers=answers, answered=False)
            return _failed(error, answers)
        finally:
            self.done.set()
        return Outcome(grpc.StatusCode.OK, "stream ended", answers)

    # -- requests (on gRPC's thread) --------------------------------------------

    def _requests(self) -> Iterator[bytes]:
        for request in self.call.requests:
            yield self._encode(request)
        yield from self._final_requests()
        self.done.wait(self.deadline)  # keep the stream open, as Envoy does, until we let go

    def _encode(self, request: Any) -> bytes:
        if isinstance(request, bytes):
            self._note_sent(_parsed(self.method, request))
            return request
        message = type(request.message)()
        message.CopyFrom(request.message)
        if request.last_nonce:
            with self._lock:
                message.response_nonce = self.nonces.get(self._type_of(message), "")
        self._note_sent(message)
        return bytes(message.SerializeToString())

    def _type_of(self, message: Any) -> str:
        return str(message.type_url) or self._fixed_type

    def _note_sent(self, message: Any) -> None:
        """Remember the names of the latest SotW request of each type."""
        if isinstance(message, discovery_pb2.DiscoveryRequest):
            with self._lock:
                self.names[self._type_of(message)] = list(message.resource_names)

    def _final_requests(self) -> Iterator[bytes]:
        type_url = self.final_type
        with self._lock:
            nonce = self.nonces.get(type_url, "")
            held = set(self.names.get(type_url, ()))
        if self.method.delta:
            self.final_name = f"fuzz-final-{next(_final_ids)}"
            message: Any = discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, resource_names_subscribe=[self.final_name]
            )
            self.final_sent = True
            yield bytes(message.SerializeToString())
            return
        candidates = [ROOTCA] if type_url == SECRET else self.clusters
        fresh = [name for name in candidates if name not in held]
        if not fresh:  # everything asked for already: ask for nothing first
            empty = discovery_pb2.DiscoveryRequest(type_url=type_url, response_nonce=nonce)
            yield bytes(empty.SerializeToString())
            fresh = candidates
        self.final_name = fresh[0]
        message = discovery_pb2.DiscoveryRequest(
            type_url=type_url, resource_names=[self.final_name], response_nonce=nonce
        )
        self.final_sent = True
        yield bytes(message.SerializeToString())

    # -- answers (on the caller's thread) -----------------------------------------

    def _read(self, raw: bytes) -> tuple[bool, str]:
        """(whether this answers the final request, why it cannot be decoded)."""
        bad = _undecodable(self.method, raw)
        if bad:
            return False, bad
        response = self.method.response.FromString(raw)
        with self._lock:
            self.nonces[response.type_url] = response.nonce
        if not self.final_sent or response.type_url != self.final_type:
            return False, ""
        if self.method.delta:
            return self.final_name in response.removed_resources, ""
        return _sotw_names(response) == {self.final_name}, ""


def _parsed(method: Method, data: bytes) -> Any:
    try:
        return method.request.FromString(data)
    except DecodeError:
        return None


def _sotw_names(response: discovery_pb2.DiscoveryResponse) -> set[str]:
    message_class, name_of = _NAME_OF.get(response.type_url, (None, None))
    if message_class is None or name_of is None:
        return set()
    names = set()
    for packed in response.resources:
        message = message_class()
        if packed.Unpack(message):
            names.add(name_of(message))
    return names
