"""A typed xDS client for protocol tests: real grpc.aio streams against a running pilot.

`XdsClient` opens streams on one channel: SotW (`ads`, `cds`, `eds`, `sds`) and
delta (`delta_ads`, `delta_cds`, `delta_eds`, `delta_sds`), plus the unary Fetch*
calls and CSDS. The channel is plaintext, or TLS with `credentials` (see
`tls_credentials`); with `token`, every call carries `authorization: Bearer`.
Each stream reads in the background into a queue, so `next_response(timeout=...)`
can fail with a clear message without cancelling the RPC.

Tests that drive the protocol step by step use `next_response`, `ack` and `nack`.
Tests that only need what pilot serves use the stream as an Envoy would:
`ack_until` reads and ACKs responses until named resources have arrived,
`ack_pending` takes whatever has already arrived, and `expect_silence` asserts
that nothing comes for a while.

Every response is checked for what any Envoy would reject outright: a missing
nonce, a resource whose type differs from the response's, the same name twice
in one response, or (delta) a name both updated and removed.

Like Envoy with `set_node_on_first_message_only`, a stream sends `node` on its
first request only.

Secrets carry private keys, which must never reach a failure message, a repr or
the arguments pytest prints for the frame that failed: failure messages describe
responses by type, names and nonce only; checks fail through `_fail` (whose only
argument is the message); `Held`, `Arrived` and `SecretSummary` never show a key.
Tests look at secrets through `secret_summaries` (or decode `Arrived` messages into
summaries of their own), not at the messages themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, TypeVar

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.cluster.v3 import cds_pb2_grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc
from envoy.service.secret.v3 import sds_pb2_grpc
from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc
from google.protobuf import any_pb2
from google.rpc import status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.support.deadline import bounded

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
CDS_SERVICE = "envoy.service.cluster.v3.ClusterDiscoveryService"
EDS_SERVICE = "envoy.service.endpoint.v3.EndpointDiscoveryService"
SDS_SERVICE = "envoy.service.secret.v3.SecretDiscoveryService"
CSDS_SERVICE = "envoy.service.status.v3.ClientStatusDiscoveryService"

DEFAULT_TIMEOUT = 5.0

DiscoveryRequest = discovery_pb2.DiscoveryRequest
DiscoveryResponse = discovery_pb2.DiscoveryResponse
DeltaRequest = discovery_pb2.DeltaDiscoveryRequest
DeltaResponse = discovery_pb2.DeltaDiscoveryResponse
Cluster = cluster_pb2.Cluster
Assignment = endpoint_pb2.ClusterLoadAssignment
Secret = secret_pb2.Secret
ClientStatusResponse = csds_pb2.ClientStatusResponse

_MESSAGE_CLASSES: dict[str, Any] = {
    CLUSTER: Cluster,
    ENDPOINT: Assignment,
    LISTENER: listener_pb2.Listener,
    ROUTE: route_pb2.RouteConfiguration,
    SECRET: Secret,
}

Req = TypeVar("Req", DiscoveryRequest, DeltaRequest)
Resp = TypeVar("Resp", DiscoveryResponse, DeltaResponse)


SIDECAR_ID = "sidecar~10.1.1.1~client.default~default.svc.cluster.local"


def node(node_id: str = SIDECAR_ID, metadata: Mapping[str, str] | None = None) -> base_pb2.Node:
    """A Node as an Istio sidecar sends it, with these string metadata fields
    (e.g. NAMESPACE, SERVICE_ACCOUNT) if given."""
    result = base_pb2.Node(id=node_id, cluster="client.default")
    for key, value in (metadata or {}).items():
        result.metadata.fields[key].string_value = value
    return result


def tls_credentials(root_pem: bytes) -> grpc.ChannelCredentials:
    """Channel credentials trusting `root_pem` (pilot's TLS port names `localhost`)."""
    return grpc.ssl_channel_credentials(root_certificates=root_pem)


def _call_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {token}"),) if token is not None else None


def rejection(message: str) -> status_pb2.Status:
    """The error_detail of a NACK (gRPC code INVALID_ARGUMENT, as Envoy sends)."""
    return status_pb2.Status(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message=message)


# --------------------------------------------------------------------------- decoding


def _fail(message: str) -> NoReturn:
    """Fail a check. Raised from here, the frame pytest prints in full has the message as
    its only argument, never the response (whose secrets hold private keys)."""
    raise AssertionError(message)


def unpack(type_url: str, packed: any_pb2.Any) -> Any:
    """A resource Any, unpacked into its message class (checking the Any's type)."""
    if packed.type_url != type_url:
        _fail(f"a {packed.type_url} in a {type_url} response")
    message = _MESSAGE_CLASSES[type_url]()
    if not packed.Unpack(message):
        _fail(f"cannot unpack {packed.type_url}")
    return message


def resource_name(message: Any) -> str:
    """The name of a Cluster, ClusterLoadAssignment or Secret."""
    if isinstance(message, Assignment):
        return str(message.cluster_name)
    return str(message.name)


def sotw_names(response: DiscoveryResponse) -> list[str]:
    """Resource names in a SotW response, in order (duplicates kept)."""
    return [resource_name(unpack(response.type_url, r)) for r in response.resources]


def sotw_resources(response: DiscoveryResponse) -> dict[str, Any]:
    """name -> message of a SotW response."""
    found = {}
    for packed in response.resources:
        message = unpack(response.type_url, packed)
        found[resource_name(message)] = message
    return found


def clusters(response: DiscoveryResponse) -> dict[str, Cluster]:
    assert response.type_url == CLUSTER, f"expected a CDS response, got {response.type_url}"
    return sotw_resources(response)


def assignments(response: DiscoveryResponse) -> dict[str, Assignment]:
    assert response.type_url == ENDPOINT, f"expected an EDS response, got {response.type_url}"
    return sotw_resources(response)


def _safe_repr(message: Any) -> str:
    if isinstance(message, Secret):
        return f"<Secret {message.name!r}>"
    return repr(message)


@dataclass(frozen=True, repr=False)
class Held:
    """One resource as a delta response delivers it (a Secret's repr shows its name only)."""

    version: str
    message: Any

    def __repr__(self) -> str:
        return f"Held(version={self.version!r}, message={_safe_repr(self.message)})"


def delta_resources(response: DeltaResponse) -> dict[str, Held]:
    """name -> (version, message) of a delta response."""
    found = {}
    for resource in response.resources:
        message = unpack(response.type_url, resource.resource)
        if resource.name != resource_name(message):
            _fail(f"Resource.name {resource.name!r} wraps {resource_name(message)!r}")
        found[resource.name] = Held(resource.version, message)
    return found


def response_resources(response: DiscoveryResponse | DeltaResponse) -> dict[str, Any]:
    """name -> message of a SotW or delta response."""
    if isinstance(response, DiscoveryResponse):
        return sotw_resources(response)
    return {name: held.message for name, held in delta_resources(response).items()}


def endpoint_ips(assignment: Assignment) -> set[str]:
    """Every host address of an assignment."""
    return {
        lb.endpoint.address.socket_address.address
        for locality in assignment.endpoints
        for lb in locality.lb_endpoints
    }


def _check_sotw(response: DiscoveryResponse) -> None:
    if not response.type_url:
        _fail("response without type_url")
    if not response.nonce:
        _fail("streamed response without nonce")
    names = sotw_names(response)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        _fail(f"same name twice in one response: {duplicates}")


def _check_delta(response: DeltaResponse) -> None:
    if not response.type_url:
        _fail("response without type_url")
    if not response.nonce:
        _fail("delta response without nonce")
    names = [r.name for r in response.resources]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        _fail(f"same name twice in one response: {duplicates}")
    removed = list(response.removed_resources)
    if len(set(removed)) != len(removed):
        _fail(f"removed twice: {removed}")
    both = set(names) & set(removed)
    if both:
        _fail(f"names both updated and removed: {sorted(both)}")
    delta_resources(response)


def describe(response: DiscoveryResponse | DeltaResponse) -> str:
    """A one-line summary of a response, for failure messages."""
    kind = response.type_url.rsplit(".", 1)[-1]
    if isinstance(response, DiscoveryResponse):
        return f"{kind} v={response.version_info} nonce={response.nonce} {sotw_names(response)}"
    updated = [r.name for r in response.resources]
    removed = list(response.removed_resources)
    return f"{kind} nonce={response.nonce} updated={updated} removed={removed}"


# --------------------------------------------------------------------------- secrets


@dataclass(frozen=True)
class SecretSummary:
    """What a test may look at in a Secret: its kind, certificates and key, never the key.

    For a `tls_certificate`: the URI SANs and serial of the chain's first certificate,
    whether a private key came with it and whether it is that certificate's key.
    For a `validation_context`: the SHA-256 fingerprints of the trusted CAs.
    Public keys are DER SubjectPublicKeyInfo (`key_public` is the private key's public
    half), kept out of the repr because they are long.
    """

    name: str
    kind: str  # "tls_certificate", "validation_context", or "" (neither)
    uris: tuple[str, ...] = ()
    serial: int | None = None
    has_key: bool = False
    key_matches_leaf: bool = False
    trusted_ca_sha256: tuple[str, ...] = ()
    leaf_public: bytes | None = field(default=None, repr=False)
    key_public: bytes | None = field(default=None, repr=False)


def _public_der(key: Any) -> bytes:
    der: bytes = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def _certificates(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _uris(certificate: x509.Certificate) -> tuple[str, ...]:
    try:
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return ()
    return tuple(extension.value.get_values_for_type(x509.UniformResourceIdentifier))


def _key_public(key_pem: bytes) -> bytes | None:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return None
    return _public_der(key.public_key())


def summarize_secret(secret: Secret) -> SecretSummary:
    """A Secret as a test may see it (never raises: a bad secret shows as empty fields)."""
    kind = secret.WhichOneof("type") or ""
    if kind == "validation_context":
        roots = _certificates(secret.validation_context.trusted_ca.inline_bytes)
        fingerprints = tuple(c.fingerprint(hashes.SHA256()).hex() for c in roots)
        return SecretSummary(secret.name, kind, trusted_ca_sha256=fingerprints)
    if kind != "tls_certificate":
        return SecretSummary(secret.name, kind)
    tls = secret.tls_certificate
    chain = _certificates(tls.certificate_chain.inline_bytes)
    leaf = chain[0] if chain else None
    leaf_public = _public_der(leaf.public_key()) if leaf is not None else None
    key_pem = tls.private_key.inline_bytes
    key_public = _key_public(key_pem) if key_pem else None
    return SecretSummary(
        secret.name,
        kind,
        uris=_uris(leaf) if leaf is not None else (),
        serial=leaf.serial_number if leaf is not None else None,
        has_key=bool(key_pem),
        key_matches_leaf=key_public is not None and key_public == leaf_public,
        leaf_public=leaf_public,
        key_public=key_public,
    )


def secret_summaries(response: DiscoveryResponse | DeltaResponse) -> list[SecretSummary]:
    """The secrets of a SotW or delta response, in order (none for other types)."""
    if response.type_url != SECRET:
        return []
    if isinstance(response, DiscoveryResponse):
        packed = list(response.resources)
    else:
        packed = [r.resource for r in response.resources]
    return [summarize_secret(unpack(SECRET, p)) for p in packed]


def fingerprint(certificate_pem: bytes) -> str:
    """The SHA-256 fingerprint of a PEM certificate, as `trusted_ca_sha256` lists them."""
    return x509.load_pem_x509_certificate(certificate_pem).fingerprint(hashes.SHA256()).hex()


# --------------------------------------------------------------------------- streams


@dataclass(frozen=True)
class Closed:
    """The server ended the stream."""

    code: grpc.StatusCode
    details: str


@dataclass(repr=False)
class Arrived:
    """What the responses read by one `ack_until` delivered of one type.

    `messages` holds the latest message of each name, so a Secret's private key:
    the repr names resources only, so that an `Arrived` may go in a failure message.
    """

    type_url: str
    messages: dict[str, Any] = field(default_factory=dict)  # name -> latest message
    times: dict[str, int] = field(default_factory=dict)  # name -> responses carrying it
    removed: list[str] = field(default_factory=list)  # names delta responses removed
    responses: int = 0  # responses read, of any type

    @property
    def names(self) -> list[str]:
        return sorted(self.messages)

    def __contains__(self, name: object) -> bool:
        return name in self.messages

    def __getitem__(self, name: str) -> Any:
        if name not in self.messages:
            _fail(f"{self!r} has no {name!r}")
        return self.messages[name]

    def __repr__(self) -> str:
        kind = self.type_url.rsplit(".", 1)[-1]
        return (
            f"Arrived({kind} {self.names}, removed={self.removed}, in {self.responses} responses)"
        )

    def record(self, response: DiscoveryResponse | DeltaResponse) -> None:
        """Count one response read, and keep what it carried of this type."""
        self.responses += 1
        if response.type_url != self.type_url:
            return
        for name, message in response_resources(response).items():
            self.messages[name] = message
            self.times[name] = self.times.get(name, 0) + 1
        if isinstance(response, DeltaResponse):
            self.removed.extend(response.removed_resources)


class _Stream(Generic[Req, Resp]):
    """One bidirectional xDS call; responses are read in the background."""

    def __init__(self, call: Any, label: str, send_node: base_pb2.Node | None) -> None:
        self._call = call
        self.label = label
        self.node = send_node
        self.sent: list[Req] = []
        self.received: list[Resp] = []
        self._queue: asyncio.Queue[Resp | Closed] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read(), name=f"read-{label}")

    async def _read(self) -> None:
        try:
            while True:
                message = await self._call.read()
                if message is grpc.aio.EOF:
                    self._queue.put_nowait(Closed(grpc.StatusCode.OK, "stream ended"))
                    return
                self._queue.put_nowait(message)
        except grpc.aio.AioRpcError as error:
            self._queue.put_nowait(Closed(error.code(), error.details() or ""))

    async def send(self, request: Req) -> None:
        """Write one request; the first one carries the node."""
        if not self.sent and self.node is not None and not request.HasField("node"):
            request.node.CopyFrom(self.node)
        self.sent.append(request)
        await self._call.write(request)

    async def next_event(self, timeout: float = DEFAULT_TIMEOUT) -> Resp | Closed:  # noqa: ASYNC109
        """The next response, or how the stream ended; fails if neither comes in time."""
        try:
            item = await bounded(self._queue.get(), timeout)
        except TimeoutError:
            last = self.sent[-1] if self.sent else None
            seen = [describe(r) for r in self.received[-3:]]
            raise AssertionError(
                f"{self.label}: nothing from the server within {timeout}s; "
                f"last request: {_short(last)}; last responses: {seen}"
            ) from None
        return self._accept(item)

    def _accept(self, item: Resp | Closed) -> Resp | Closed:
        if not isinstance(item, Closed):
            self._check(item)
            self.received.append(item)
        return item

    async def next_response(self, timeout: float = DEFAULT_TIMEOUT) -> Resp:  # noqa: ASYNC109
        """The next response; fails clearly on timeout or if the stream ended."""
        return self._response(await self.next_event(timeout))

    def _response(self, item: Resp | Closed) -> Resp:
        if isinstance(item, Closed):
            _fail(f"{self.label}: stream ended: {item.code.name} {item.details}")
        return item

    def _check(self, response: Resp) -> None:
        raise NotImplementedError

    async def ack(self, response: Resp) -> None:
        raise NotImplementedError

    async def ack_until(
        self,
        type_url: str,
        names: Iterable[str],
        timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109
    ) -> Arrived:
        """As Envoy does: read responses, ACKing each whatever its type, until every one
        of `names` of `type_url` has arrived in a response read by this call. Returns
        what those responses carried of that type; fails if the stream ends first."""
        wanted = set(names)
        arrived = Arrived(type_url)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not wanted <= arrived.messages.keys():
            missing = sorted(wanted - arrived.messages.keys())
            try:
                response = await self.next_response(max(deadline - loop.time(), 0.0))
            except AssertionError as error:
                _fail(f"{self.label}: waiting for {missing} ({arrived!r}): {error}")
            arrived.record(response)
            await self.ack(response)
        return arrived

    async def ack_pending(self) -> list[Resp]:
        """Read and ACK every response that has already arrived, without waiting for
        more; fails if the stream has ended."""
        responses = []
        while not self._queue.empty():
            response = self._response(self._accept(self._queue.get_nowait()))
            await self.ack(response)
            responses.append(response)
        return responses

    async def expect_silence(self, seconds: float) -> None:
        """Assert that nothing at all arrives for `seconds`, not even the stream's end:
        for a test whose point is that nothing happens by a deadline."""
        try:
            item = await bounded(self._queue.get(), max(seconds, 0.0))
        except TimeoutError:
            return
        shown = item if isinstance(item, Closed) else describe(item)
        _fail(f"{self.label}: expected nothing for {seconds:.2f}s, got {shown}")

    async def close(self) -> None:
        """Cancel the call (as a disconnecting Envoy does)."""
        self._call.cancel()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


def _short(request: DiscoveryRequest | DeltaRequest | None) -> str:
    if request is None:
        return "none"
    copy = type(request)()
    copy.CopyFrom(request)
    copy.ClearField("node")
    return str(copy).replace("\n", " ")


class SotwStream(_Stream[DiscoveryRequest, DiscoveryResponse]):
    """A state-of-the-world stream, tracking per type what an Envoy would send.

    `subscribe` replaces the names of a type and, like Envoy, carries the latest
    nonce and last accepted version of that type; `ack` and `nack` answer a response.
    """

    def __init__(self, call: Any, label: str, send_node: base_pb2.Node | None) -> None:
        super().__init__(call, label, send_node)
        self.names: dict[str, list[str]] = {}
        self.accepted: dict[str, str] = {}
        self.nonces: dict[str, str] = {}

    def _check(self, response: DiscoveryResponse) -> None:
        _check_sotw(response)
        self.nonces[response.type_url] = response.nonce

    async def request(
        self,
        type_url: str,
        names: Iterable[str] = (),
        *,
        version: str = "",
        nonce: str = "",
        error: str | None = None,
    ) -> None:
        """Send exactly this request (nothing filled in but the node on the first one)."""
        request = DiscoveryRequest(
            type_url=type_url,
            resource_names=list(names),
            version_info=version,
            response_nonce=nonce,
        )
        if error is not None:
            request.error_detail.CopyFrom(rejection(error))
        await self.send(request)

    async def subscribe(self, type_url: str, names: Iterable[str] = ()) -> None:
        """Ask for these names (empty: wildcard on a first request, else nothing)."""
        self.names[type_url] = list(names)
        await self.request(
            type_url,
            self.names[type_url],
            version=self.accepted.get(type_url, ""),
            nonce=self.nonces.get(type_url, ""),
        )

    async def unsubscribe(self, type_url: str, names: Iterable[str]) -> None:
        """Ask for the type's names without these, as Envoy does when it stops using
        them (none left: an empty list, which for names asked for by name is nothing)."""
        gone = set(names)
        await self.subscribe(type_url, [n for n in self.names.get(type_url, []) if n not in gone])

    async def ack(self, response: DiscoveryResponse) -> None:
        """Accept a response: its version and nonce, the current names."""
        self.accepted[response.type_url] = response.version_info
        await self.request(
            response.type_url,
            self.names.get(response.type_url, []),
            version=response.version_info,
            nonce=response.nonce,
        )

    async def nack(self, response: DiscoveryResponse, message: str = "rejected by test") -> None:
        """Reject a response: its nonce, the last accepted version, an error_detail."""
        await self.request(
            response.type_url,
            self.names.get(response.type_url, []),
            version=self.accepted.get(response.type_url, ""),
            nonce=response.nonce,
            error=message,
        )

    async def expect(
        self,
        type_url: str,
        timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109
    ) -> DiscoveryResponse:
        """The next response, which must be of this type."""
        response = await self.next_response(timeout)
        assert response.type_url == type_url, (
            f"{self.label}: expected a {type_url.rsplit('.', 1)[-1]} response, "
            f"got {describe(response)}"
        )
        return response


class DeltaStream(_Stream[DeltaRequest, DeltaResponse]):
    """An incremental stream; `held` is the client's view, updated by `apply`."""

    def __init__(self, call: Any, label: str, send_node: base_pb2.Node | None) -> None:
        super().__init__(call, label, send_node)
        self.held: dict[str, dict[str, Held]] = {}

    def _check(self, response: DeltaResponse) -> None:
        _check_delta(response)

    async def request(
        self,
        type_url: str,
        subscribe: Iterable[str] = (),
        unsubscribe: Iterable[str] = (),
        *,
        initial_versions: Mapping[str, str] | None = None,
        nonce: str = "",
        error: str | None = None,
    ) -> None:
        """Send exactly this request (nothing filled in but the node on the first one)."""
        request = DeltaRequest(
            type_url=type_url,
            resource_names_subscribe=list(subscribe),
            resource_names_unsubscribe=list(unsubscribe),
            initial_resource_versions=dict(initial_versions or {}),
            response_nonce=nonce,
        )
        if error is not None:
            request.error_detail.CopyFrom(rejection(error))
        await self.send(request)

    async def subscribe(self, type_url: str, names: Iterable[str] = ()) -> None:
        await self.request(type_url, subscribe=names)

    async def unsubscribe(self, type_url: str, names: Iterable[str]) -> None:
        """Unsubscribe, and drop the names from the client's view (as Envoy does)."""
        names = list(names)
        for name in names:
            self.held.get(type_url, {}).pop(name, None)
        await self.request(type_url, unsubscribe=names)

    def apply(self, response: DeltaResponse) -> None:
        """Update the client's view with a response."""
        view = self.held.setdefault(response.type_url, {})
        view.update(delta_resources(response))
        for name in response.removed_resources:
            view.pop(name, None)

    def versions(self, type_url: str) -> dict[str, str]:
        """name -> version the client holds (what it would send on reconnect)."""
        return {name: held.version for name, held in self.held.get(type_url, {}).items()}

    async def ack(self, response: DeltaResponse) -> None:
        """Apply and accept a response."""
        self.apply(response)
        await self.request(response.type_url, nonce=response.nonce)

    async def nack(self, response: DeltaResponse, message: str = "rejected by test") -> None:
        """Reject a response (the view stays as it was)."""
        await self.request(response.type_url, nonce=response.nonce, error=message)

    async def expect(
        self,
        type_url: str,
        timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109
    ) -> DeltaResponse:
        """The next response, which must be of this type."""
        response = await self.next_response(timeout)
        assert response.type_url == type_url, (
            f"{self.label}: expected a {type_url.rsplit('.', 1)[-1]} response, "
            f"got {describe(response)}"
        )
        return response


# --------------------------------------------------------------------------- one-shot exchange

ADS_SOTW = f"/{ADS_SERVICE}/StreamAggregatedResources"
ADS_DELTA = f"/{ADS_SERVICE}/DeltaAggregatedResources"
CDS_SOTW = f"/{CDS_SERVICE}/StreamClusters"
SDS_SOTW = f"/{SDS_SERVICE}/StreamSecrets"
SDS_DELTA = f"/{SDS_SERVICE}/DeltaSecrets"


def _first_reply_blocking(
    target: str,
    method: str,
    requests: Sequence[DiscoveryRequest | DeltaRequest],
    credentials: grpc.ChannelCredentials | None,
    token: str | None,
) -> DiscoveryResponse | DeltaResponse | Closed:
    delta = method.rsplit("/", 1)[-1].startswith("Delta")
    response_class = DeltaResponse if delta else DiscoveryResponse
    stop = threading.Event()

    def stream() -> Iterator[DiscoveryRequest | DeltaRequest]:
        yield from requests
        stop.wait(DEFAULT_TIMEOUT)  # keep the stream open (Envoy never half-closes)

    channel = (
        grpc.secure_channel(target, credentials)
        if credentials is not None
        else grpc.insecure_channel(target)
    )
    with channel:
        rpc = channel.stream_stream(
            method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_class.FromString,
        )
        call = rpc(stream(), timeout=DEFAULT_TIMEOUT, metadata=_call_metadata(token))
        try:
            reply: DiscoveryResponse | DeltaResponse = next(call)
        except grpc.RpcError as error:
            return Closed(error.code(), error.details() or "")  # type: ignore[attr-defined]
        except StopIteration:
            return Closed(grpc.StatusCode.OK, "stream ended")
        finally:
            stop.set()
            call.cancel()
        return reply


async def first_reply(
    target: str,
    method: str,
    requests: Sequence[DiscoveryRequest | DeltaRequest],
    *,
    credentials: grpc.ChannelCredentials | None = None,
    token: str | None = None,
) -> DiscoveryResponse | DeltaResponse | Closed:
    """Send `requests` on a fresh stream and return the first response, or how it ended.

    `credentials` and `token` as for `XdsClient`. Uses the blocking gRPC API in a
    thread: with grpc.aio, a write that races the server closing the stream replaces
    the server's status with a local INTERNAL error, which would hide what the server
    answered.
    """
    return await asyncio.to_thread(
        _first_reply_blocking, target, method, requests, credentials, token
    )


# --------------------------------------------------------------------------- channel


@dataclass
class XdsClient:
    """A gRPC channel to pilot and the streams opened on it (all closed on `aclose`).

    Plaintext, or TLS with `credentials` (e.g. `tls_credentials(root)`, dialing
    `localhost:PORT`); with `token`, every stream and unary call carries
    `authorization: Bearer <token>`, as an Envoy with a service-account token does.
    """

    target: str
    channel: grpc.aio.Channel = field(init=False)
    streams: list[_Stream[Any, Any]] = field(default_factory=list)
    credentials: grpc.ChannelCredentials | None = field(default=None, kw_only=True, repr=False)
    token: str | None = field(default=None, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        # Each client its own TCP connection, as each Envoy has (not one shared by all).
        options = [("grpc.use_local_subchannel_pool", 1)]
        if self.credentials is not None:
            self.channel = grpc.aio.secure_channel(self.target, self.credentials, options)
        else:
            self.channel = grpc.aio.insecure_channel(self.target, options)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        """What every call carries (the bearer token, if any)."""
        return _call_metadata(self.token)

    async def aclose(self) -> None:
        for stream in self.streams:
            await stream.close()
        await self.channel.close()

    async def __aenter__(self) -> XdsClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _sotw(self, call: Any, label: str, send_node: base_pb2.Node | None) -> SotwStream:
        stream = SotwStream(call, label, send_node)
        self.streams.append(stream)
        return stream

    def _delta(self, call: Any, label: str, send_node: base_pb2.Node | None) -> DeltaStream:
        stream = DeltaStream(call, label, send_node)
        self.streams.append(stream)
        return stream

    def ads(self, send_node: base_pb2.Node | None = None) -> SotwStream:
        """StreamAggregatedResources."""
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        return self._sotw(
            stub.StreamAggregatedResources(metadata=self.metadata), "ads", send_node or node()
        )

    def delta_ads(self, send_node: base_pb2.Node | None = None) -> DeltaStream:
        """DeltaAggregatedResources."""
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        return self._delta(
            stub.DeltaAggregatedResources(metadata=self.metadata), "delta-ads", send_node or node()
        )

    async def delta_ads_status(self, deadline: float = 10.0) -> tuple[grpc.StatusCode, str]:
        """Open a DeltaAggregatedResources stream, send nothing, and return the status it
        ends with (a stream refused at once, say for its credentials). Nothing is
        written because a Python client whose write races the refusal loses the status
        ("Internal error from Core"); Envoy's client does not."""
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        call = stub.DeltaAggregatedResources(metadata=self.metadata, timeout=deadline)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await call.read()
        return await call.code(), await call.details()

    def cds(self, send_node: base_pb2.Node | None = None) -> SotwStream:
        """ClusterDiscoveryService.StreamClusters."""
        stub = cds_pb2_grpc.ClusterDiscoveryServiceStub(self.channel)
        return self._sotw(stub.StreamClusters(metadata=self.metadata), "cds", send_node or node())

    def delta_cds(self, send_node: base_pb2.Node | None = None) -> DeltaStream:
        """ClusterDiscoveryService.DeltaClusters."""
        stub = cds_pb2_grpc.ClusterDiscoveryServiceStub(self.channel)
        return self._delta(
            stub.DeltaClusters(metadata=self.metadata), "delta-cds", send_node or node()
        )

    def eds(self, send_node: base_pb2.Node | None = None) -> SotwStream:
        """EndpointDiscoveryService.StreamEndpoints."""
        stub = eds_pb2_grpc.EndpointDiscoveryServiceStub(self.channel)
        return self._sotw(stub.StreamEndpoints(metadata=self.metadata), "eds", send_node or node())

    def delta_eds(self, send_node: base_pb2.Node | None = None) -> DeltaStream:
        """EndpointDiscoveryService.DeltaEndpoints."""
        stub = eds_pb2_grpc.EndpointDiscoveryServiceStub(self.channel)
        return self._delta(
            stub.DeltaEndpoints(metadata=self.metadata), "delta-eds", send_node or node()
        )

    def sds(self, send_node: base_pb2.Node | None = None) -> SotwStream:
        """SecretDiscoveryService.StreamSecrets."""
        stub = sds_pb2_grpc.SecretDiscoveryServiceStub(self.channel)
        return self._sotw(stub.StreamSecrets(metadata=self.metadata), "sds", send_node or node())

    def delta_sds(self, send_node: base_pb2.Node | None = None) -> DeltaStream:
        """SecretDiscoveryService.DeltaSecrets."""
        stub = sds_pb2_grpc.SecretDiscoveryServiceStub(self.channel)
        return self._delta(
            stub.DeltaSecrets(metadata=self.metadata), "delta-sds", send_node or node()
        )

    async def fetch_clusters(self, names: Iterable[str] = ()) -> DiscoveryResponse:
        """ClusterDiscoveryService.FetchClusters."""
        stub = cds_pb2_grpc.ClusterDiscoveryServiceStub(self.channel)
        request = DiscoveryRequest(type_url=CLUSTER, resource_names=list(names), node=node())
        response: DiscoveryResponse = await stub.FetchClusters(
            request, timeout=DEFAULT_TIMEOUT, metadata=self.metadata
        )
        return response

    async def fetch_endpoints(self, names: Iterable[str]) -> DiscoveryResponse:
        """EndpointDiscoveryService.FetchEndpoints."""
        stub = eds_pb2_grpc.EndpointDiscoveryServiceStub(self.channel)
        request = DiscoveryRequest(type_url=ENDPOINT, resource_names=list(names), node=node())
        response: DiscoveryResponse = await stub.FetchEndpoints(
            request, timeout=DEFAULT_TIMEOUT, metadata=self.metadata
        )
        return response

    async def health(self, service: str = "") -> health_pb2.HealthCheckResponse.ServingStatus:
        """grpc.health.v1.Health/Check."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        request = health_pb2.HealthCheckRequest(service=service)
        response = await stub.Check(request, timeout=DEFAULT_TIMEOUT, metadata=self.metadata)
        return response.status  # type: ignore[no-any-return]

    async def client_status(
        self, node_ids: Iterable[str] = (), *, exclude_contents: bool = True
    ) -> ClientStatusResponse:
        """ClientStatusDiscoveryService.FetchClientStatus, matching these node ids exactly
        (none: every proxy)."""
        stub = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(self.channel)
        request = csds_pb2.ClientStatusRequest(exclude_resource_contents=exclude_contents)
        for node_id in node_ids:
            matcher = request.node_matchers.add()
            matcher.node_id.exact = node_id
        response: ClientStatusResponse = await stub.FetchClientStatus(
            request, timeout=DEFAULT_TIMEOUT, metadata=self.metadata
        )
        return response

    async def reflected_services(self) -> set[str]:
        """Service names listed by server reflection."""
        stub = reflection_pb2_grpc.ServerReflectionStub(self.channel)
        call = stub.ServerReflectionInfo(timeout=DEFAULT_TIMEOUT, metadata=self.metadata)
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        await call.done_writing()
        reply = await call.read()
        assert reply is not grpc.aio.EOF, "reflection sent no reply"
        return {s.name for s in reply.list_services_response.service}
