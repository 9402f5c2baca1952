"""Support for the SDS integration tests: secrets decoded safely, an SDS client, mTLS Envoys.

* `WorkloadCert` / `decode_*`: a `default` secret read into what tests compare (serial,
  SANs, a fingerprint of the key) without ever keeping the private key in anything that
  could be printed: neither the key nor a `Secret` message may reach an assertion message.
* `SecretStream`: one real gRPC stream to pilot, SotW or delta, over ADS or the
  SecretDiscoveryService, that ACKs what it receives as Envoy does.
* Bootstraps for a *server* Envoy (a static listener terminating mTLS with `default` and
  `ROOTCA` over ADS, in front of a local HTTP backend) and a *client* Envoy (a plain-HTTP
  listener in front of a static cluster speaking mTLS with secrets from pilot's
  SecretDiscoveryService, since Envoy 1.40 cannot start with a static cluster on ADS SDS).
* `Backend` (the local HTTP server), `/certs` and `/listeners` readers, a raw TLS probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import itertools
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias, cast

import aiohttp
import grpc
from aiohttp import web
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, struct_pb2

from pilot.generators.sds import workload_secret
from pilot.security.ca import CertificateAuthority
from pilot.security.certs import KeyType, new_key_and_csr
from pilot.security.identity import Identity
from pilot.security.secrets import SecretManager
from pilot.xds.proxy import ProxyKey
from tests.harness.envoy_process import EnvoyProcess, Json, load_example_bootstrap
from tests.support.pilot import RunningPilot

SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
WORKLOAD = "default"
ROOT = "ROOTCA"
TRUST_DOMAIN = "cluster.local"
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


def spiffe(namespace: str, account: str) -> str:
    """The SPIFFE identity pilot gives a proxy of this namespace and service account."""
    return f"spiffe://{TRUST_DOMAIN}/ns/{namespace}/sa/{account}"


def sidecar_id(name: str, namespace: str, ip: str = "127.0.0.1") -> str:
    """An Istio-shaped sidecar node id."""
    return f"sidecar~{ip}~{name}.{namespace}~{namespace}.svc.cluster.local"


def identity_metadata(namespace: str, account: str) -> dict[str, str]:
    """Node metadata that names a proxy's identity (pilot runs with --xds-auth none)."""
    return {"NAMESPACE": namespace, "SERVICE_ACCOUNT": account}


@dataclass(frozen=True)
class Proxy:
    """One proxy as pilot knows it: its node id and the identity its metadata claims."""

    node_id: str
    namespace: str
    account: str

    @classmethod
    def sidecar(cls, name: str, namespace: str, account: str) -> Proxy:
        return cls(sidecar_id(name, namespace), namespace, account)

    @property
    def uri(self) -> str:
        return spiffe(self.namespace, self.account)

    @property
    def metadata(self) -> dict[str, str]:
        return identity_metadata(self.namespace, self.account)

    def node(self) -> base_pb2.Node:
        """The Node an Envoy of this proxy sends on its first request."""
        metadata = struct_pb2.Struct()
        metadata.update(self.metadata)
        return base_pb2.Node(id=self.node_id, cluster=f"{self.namespace}.svc", metadata=metadata)


# --------------------------------------------------------------------------- secrets


def _spki(public_key: Any) -> bytes:
    der: bytes = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def _uris(certificate: x509.Certificate) -> tuple[str, ...]:
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return ()
    return tuple(san.value.get_values_for_type(x509.UniformResourceIdentifier))


def _key_kind(public_key: Any) -> str:
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        return f"EC {public_key.curve.name}"
    if isinstance(public_key, rsa.RSAPublicKey):
        return f"RSA {public_key.key_size}"
    return type(public_key).__name__


@dataclass(frozen=True)
class WorkloadCert:
    """A `default` secret as a test may compare and print it: no private key inside.

    `key_id` is a SHA-256 of the private key PEM, so two secrets with the same key
    compare equal without the key ever being kept.
    """

    serial: int
    uris: tuple[str, ...]
    key_kind: str
    key_id: str
    public_key_id: str  # SHA-256 of the leaf's SubjectPublicKeyInfo
    key_matches_leaf: bool
    not_before: datetime.datetime
    not_after: datetime.datetime
    chain_length: int
    leaf_sha256: str = field(repr=False)  # what Envoy puts in XFCC `Hash=`
    chain: tuple[x509.Certificate, ...] = field(repr=False, compare=False)

    def signed_by(self, root_pem: str) -> bool:
        """Whether the chain ends in `root_pem` and every link is signed by the next."""
        root = x509.load_pem_x509_certificate(root_pem.encode())
        links = [*self.chain, root] if self.chain[-1] != root else list(self.chain)
        try:
            for child, parent in itertools.pairwise(links):
                child.verify_directly_issued_by(parent)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return links[-1] == root


def decode_secret(packed: any_pb2.Any) -> secret_pb2.Secret:
    assert packed.type_url == SECRET_TYPE, f"a {packed.type_url} where a Secret was expected"
    secret = secret_pb2.Secret()
    assert packed.Unpack(secret), "cannot unpack a Secret"
    return secret


def _key_facts(key_pem: bytes, leaf_spki: bytes) -> tuple[str, bool]:
    """(SHA-256 of the key PEM, whether the key is the leaf's): all a test keeps of a key."""
    private_key = serialization.load_pem_private_key(key_pem, password=None)
    return hashlib.sha256(key_pem).hexdigest(), _spki(private_key.public_key()) == leaf_spki


def workload_cert(secret: secret_pb2.Secret) -> WorkloadCert:
    """Read a `default` secret; its key is hashed and checked against the leaf, then forgotten."""
    assert secret.name == WORKLOAD, f"expected the {WORKLOAD!r} secret, got {secret.name!r}"
    assert secret.HasField("tls_certificate"), "the default secret has no tls_certificate"
    tls = secret.tls_certificate
    assert tls.private_key.inline_bytes, "the default secret has no inline private key"
    chain = tuple(x509.load_pem_x509_certificates(tls.certificate_chain.inline_bytes))
    leaf = chain[0]
    leaf_spki = _spki(leaf.public_key())
    key_id, key_matches_leaf = _key_facts(tls.private_key.inline_bytes, leaf_spki)
    return WorkloadCert(
        serial=leaf.serial_number,
        uris=_uris(leaf),
        key_kind=_key_kind(leaf.public_key()),
        key_id=key_id,
        public_key_id=hashlib.sha256(leaf_spki).hexdigest(),
        key_matches_leaf=key_matches_leaf,
        not_before=leaf.not_valid_before_utc,
        not_after=leaf.not_valid_after_utc,
        chain_length=len(chain),
        leaf_sha256=leaf.fingerprint(hashes.SHA256()).hex(),
        chain=chain,
    )


def root_of(secret: secret_pb2.Secret) -> str:
    """The trusted CA PEM of a `ROOTCA` secret."""
    assert secret.name == ROOT, f"expected the {ROOT!r} secret, got {secret.name!r}"
    assert secret.HasField("validation_context"), "ROOTCA has no validation_context"
    return str(secret.validation_context.trusted_ca.inline_bytes.decode())


def served_workload(secrets: SecretManager, proxy: Proxy | ProxyKey) -> WorkloadCert | None:
    """What pilot's SecretManager keeps for a proxy as `default` right now (None: nothing)."""
    key = proxy if isinstance(proxy, ProxyKey) else ProxyKey(proxy.node_id, proxy.uri)
    certificate = secrets.current(key)
    if certificate is None:
        return None
    return workload_cert(secret_pb2.Secret.FromString(workload_secret(certificate).payload))


# --------------------------------------------------------------------------- SDS client


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


# --------------------------------------------------------------------------- bootstraps

ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}
HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)
TLS_SOCKET = "envoy.transport_sockets.tls"
HTTP_OPTIONS_TYPE = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
TLS_TYPES = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."


def ads_sds() -> Json:
    """Secrets over the ADS stream: what listeners (and dynamic clusters) use."""
    return {"ads": {}, "resource_api_version": "V3"}


def grpc_sds(delta: bool = False) -> Json:
    """Secrets from pilot's SecretDiscoveryService on the xds-grpc cluster (static clusters)."""
    return {
        "api_config_source": {
            "api_type": "DELTA_GRPC" if delta else "GRPC",
            "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}],
        },
        "resource_api_version": "V3",
    }


def _tls_context(sds_config: Json, peer_san: str | None) -> Json:
    validation: Json = {"name": ROOT, "sds_config": sds_config}
    context: Json = {
        "tls_certificate_sds_secret_configs": [{"name": WORKLOAD, "sds_config": sds_config}]
    }
    if peer_san is None:
        context["validation_context_sds_secret_config"] = validation
    else:
        match = {"san_type": "URI", "matcher": {"exact": peer_san}}
        context["combined_validation_context"] = {
            "default_validation_context": {"match_typed_subject_alt_names": [match]},
            "validation_context_sds_secret_config": validation,
        }
    return context


def _static_cluster(name: str, port: int, **extra: Any) -> Json:
    endpoint = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
        },
        **extra,
    }


def _http_listener(name: str, cluster: str, **hcm_extra: Any) -> Json:
    hcm = {
        "@type": HCM_TYPE,
        "stat_prefix": name.replace("-", "_"),
        "route_config": {
            "name": f"{name}-routes",
            "virtual_hosts": [
                {
                    "name": cluster,
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}],
                }
            ],
        },
        "http_filters": [ROUTER],
        **hcm_extra,
    }
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                ]
            }
        ],
    }


MTLS_LISTENER = "mtls-in"
BACKEND_CLUSTER = "backend"
PLAIN_LISTENER = "http-out"
SERVER_CLUSTER = "shop-server"


def server_bootstrap(xds_port: int, proxy: Proxy, *, backend_port: int, example: str) -> Json:
    """An Envoy that terminates mTLS (`default` and `ROOTCA` over ADS) in front of a backend.

    The listener requires a client certificate chained to pilot's root and tells the
    backend who called in `x-forwarded-client-cert` (URI SAN and certificate hash).
    """
    bootstrap = load_example_bootstrap(example, xds_port, proxy.node_id, proxy.metadata)
    listener = _http_listener(
        MTLS_LISTENER,
        BACKEND_CLUSTER,
        forward_client_cert_details="SANITIZE_SET",
        set_current_client_cert_details={"uri": True},
    )
    listener["filter_chains"][0]["transport_socket"] = {
        "name": TLS_SOCKET,
        "typed_config": {
            "@type": TLS_TYPES + "DownstreamTlsContext",
            "require_client_certificate": True,
            "common_tls_context": _tls_context(ads_sds(), None),
        },
    }
    static = bootstrap["static_resources"]
    static["listeners"] = [listener]
    static["clusters"].append(_static_cluster(BACKEND_CLUSTER, backend_port))
    return bootstrap


def client_bootstrap(
    xds_port: int,
    proxy: Proxy,
    *,
    server_port: int,
    server_san: str,
    example: str,
    sds_delta: bool = False,
) -> Json:
    """An Envoy whose plain-HTTP listener routes to a static cluster speaking mTLS.

    The cluster takes `default` and `ROOTCA` from pilot's SecretDiscoveryService, checks
    the server's URI SAN, and opens a new connection (a new handshake) per request.
    """
    bootstrap = load_example_bootstrap(example, xds_port, proxy.node_id, proxy.metadata)
    cluster = _static_cluster(
        SERVER_CLUSTER,
        server_port,
        transport_socket={
            "name": TLS_SOCKET,
            "typed_config": {
                "@type": TLS_TYPES + "UpstreamTlsContext",
                "common_tls_context": _tls_context(grpc_sds(sds_delta), server_san),
            },
        },
        typed_extension_protocol_options={
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS_TYPE,
                "common_http_protocol_options": {"max_requests_per_connection": 1},
                "explicit_http_config": {"http_protocol_options": {}},
            }
        },
    )
    static = bootstrap["static_resources"]
    static["listeners"] = [_http_listener(PLAIN_LISTENER, SERVER_CLUSTER)]
    static["clusters"].append(cluster)
    return bootstrap


# --------------------------------------------------------------------------- Envoy admin


@dataclass(frozen=True)
class EnvoyCert:
    """One certificate as Envoy's /certs reports it."""

    serial: int
    uris: tuple[str, ...]
    expires: datetime.datetime


def _envoy_cert(entry: Json) -> EnvoyCert:
    uris = tuple(san["uri"] for san in entry.get("subject_alt_names", []) if "uri" in san)
    expires = datetime.datetime.fromisoformat(entry["expiration_time"].replace("Z", "+00:00"))
    return EnvoyCert(int(entry["serial_number"], 16), uris, expires)


async def own_certs(envoy: EnvoyProcess) -> set[EnvoyCert]:
    """The leaf certificates of every TLS context of this Envoy (its own identity)."""
    found: set[EnvoyCert] = set()
    for context in (await envoy.certs()).get("certificates", []):
        for entry in context.get("cert_chain", [])[:1]:
            found.add(_envoy_cert(entry))
    return found


async def ca_certs(envoy: EnvoyProcess) -> set[EnvoyCert]:
    """The trust roots of every TLS context of this Envoy."""
    found: set[EnvoyCert] = set()
    for context in (await envoy.certs()).get("certificates", []):
        found.update(_envoy_cert(entry) for entry in context.get("ca_cert", []))
    return found


async def listener_port(envoy: EnvoyProcess, name: str) -> int:
    """The port a listener bound (listeners ask for port 0)."""
    data = await envoy.admin_json("/listeners", {"format": "json"})
    for status in data.get("listener_statuses", []):
        if status.get("name") == name:
            port = int(status["local_address"]["socket_address"].get("port_value", 0))
            assert port, f"listener {name} has no port yet: {status}"
            return port
    raise AssertionError(f"Envoy {envoy.name} has no listener {name}: {data}")


# --------------------------------------------------------------------------- backend


@dataclass(frozen=True)
class Seen:
    """One request the backend received."""

    path: str
    xfcc: str

    def xfcc_field(self, key: str) -> str | None:
        """One field of the (single-element) x-forwarded-client-cert header, unquoted."""
        for part in _split_xfcc(self.xfcc):
            name, _, value = part.partition("=")
            if name == key:
                return urllib.parse.unquote(value.strip('"'))
        return None


def _split_xfcc(header: str) -> list[str]:
    parts, current, quoted = [], "", False
    for char in header:
        if char == '"':
            quoted = not quoted
        if char == ";" and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current] if current else parts


BACKEND_BODY = "hello from the shop backend"


class Backend:
    """A small HTTP server on 127.0.0.1 (ephemeral port) that records every request."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _handle(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(request.path, request.headers.get("x-forwarded-client-cert", "")))
        return web.Response(text=f"{BACKEND_BODY} {request.path}")

    async def __aenter__(self) -> Backend:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server: Any = site._server  # aiohttp has no public accessor for the bound port
        self.port = int(server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


# --------------------------------------------------------------------------- TLS probe


@dataclass(frozen=True)
class TlsOutcome:
    """What a raw TLS client saw: an HTTP status line, or why it got none."""

    status_line: str | None
    error: str | None
    peer_uris: tuple[str, ...] = ()
    peer_serial: int | None = None


async def tls_get(
    port: int,
    root_pem: str,
    workdir: Path,
    client_pem: tuple[bytes, bytes] | None = None,
    timeout: float = 5.0,  # noqa: ASYNC109 - a bound on one probe
) -> TlsOutcome:
    """Connect to 127.0.0.1:port with TLS trusting `root_pem`, GET /probe, read the status.

    `client_pem` is (chain PEM, key PEM) to present, written 0600 to `workdir` for
    `ssl`; without it no client certificate is offered. Names are not checked (SPIFFE
    certificates carry only a URI SAN); the chain is.
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=root_pem)
    context.check_hostname = False
    if client_pem is not None:
        chain_path, key_path = workdir / "probe-chain.pem", workdir / "probe-key.pem"
        chain_path.write_bytes(client_pem[0])
        key_path.touch(mode=0o600)
        key_path.write_bytes(client_pem[1])
        context.load_cert_chain(chain_path, key_path)
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            peer = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            certificate = x509.load_der_x509_certificate(peer)
            writer.write(b"GET /probe HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n")
            await writer.drain()
            line = await reader.readline()
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError) as error:
        return TlsOutcome(None, f"{type(error).__name__}: {error}")
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                await writer.wait_closed()
    if not line:
        return TlsOutcome(None, "connection closed without an answer")
    return TlsOutcome(
        line.decode(errors="replace").strip(), None, _uris(certificate), certificate.serial_number
    )


def probe_credentials(ca: CertificateAuthority, identity: Identity) -> tuple[bytes, bytes]:
    """(chain PEM, key PEM) for a test client, signed by `ca` for `identity` (one hour)."""
    key_pem, csr = new_key_and_csr(KeyType.EC, [identity.uri])
    chain = ca.sign(csr, identity, datetime.timedelta(hours=1))
    return "".join(chain).encode(), key_pem


# --------------------------------------------------------------------------- the mTLS pair

SERVER = Proxy.sidecar("server-1", "shop", "server")
CLIENT = Proxy.sidecar("client-1", "web", "client")
STARTUP = 30.0
# pilot must serve at least one cluster: over delta ADS, an empty mesh leaves Envoy's CDS
# waiting for its initial fetch timeout (10 s in the examples) before it goes LIVE.
MESH_SERVICES = {"catalog": ["127.0.1.1"]}


@dataclass
class MtlsPair:
    """Two Envoys, the backend behind them, and where to reach each."""

    server: EnvoyProcess
    client: EnvoyProcess
    backend: Backend
    mtls_port: int  # the server Envoy's mTLS listener
    http_port: int  # the client Envoy's plain-HTTP listener

    async def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:  # noqa: ASYNC109
        """GET through the client Envoy (plain HTTP) -> server Envoy (mTLS) -> backend."""
        url = f"http://127.0.0.1:{self.http_port}{path}"
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(url) as response,
        ):
            return response.status, await response.text()


async def wait_for_own_cert(envoy: EnvoyProcess, uri: str) -> EnvoyCert:
    """Wait until /certs shows a certificate for `uri`; return it."""
    certs = await envoy.wait_for(
        lambda: own_certs(envoy),
        STARTUP,
        f"/certs to show a certificate for {uri}",
        until=lambda found: any(uri in cert.uris for cert in found),
    )
    return next(cert for cert in certs if uri in cert.uris)


@asynccontextmanager
async def mtls_pair(
    pilot: RunningPilot,
    workdir: Path,
    *,
    server_example: str = "envoy-ads-delta.yaml",
    client_example: str = "envoy-ads-sotw.yaml",
    client_sds_delta: bool = False,
) -> AsyncIterator[MtlsPair]:
    """Start the backend, the server Envoy, then the client Envoy; return once both serve.

    Ready means: each Envoy's /certs shows its own identity, both are LIVE, both
    listeners are bound, and the client's cluster has taken both secrets over SDS.
    """
    async with Backend() as backend:
        server_boot = server_bootstrap(
            pilot.grpc_port, SERVER, backend_port=backend.port, example=server_example
        )
        async with EnvoyProcess(server_boot, workdir / "server", "server") as server:
            await wait_for_own_cert(server, SERVER.uri)
            await server.wait_live(STARTUP)
            mtls_port = await server.wait_for(
                lambda: listener_port(server, MTLS_LISTENER), STARTUP, "the mTLS listener"
            )
            client_boot = client_bootstrap(
                pilot.grpc_port,
                CLIENT,
                server_port=mtls_port,
                server_san=SERVER.uri,
                example=client_example,
                sds_delta=client_sds_delta,
            )
            async with EnvoyProcess(client_boot, workdir / "client", "client") as client:
                await wait_for_own_cert(client, CLIENT.uri)
                await client.wait_live(STARTUP)
                http_port = await client.wait_for(
                    lambda: listener_port(client, PLAIN_LISTENER), STARTUP, "the HTTP listener"
                )
                await client.wait_for_stat(
                    f"cluster.{SERVER_CLUSTER}.client_ssl_socket_factory.ssl_context_update_by_sds",
                    lambda value: isinstance(value, int) and value >= 2,
                    STARTUP,
                )
                yield MtlsPair(server, client, backend, mtls_port, http_port)


async def listener_ssl_stat(envoy: EnvoyProcess, name: str) -> int:
    """The sum of `listener.<address>.ssl.<name>` over every listener of this Envoy."""
    stats = await envoy.stats(regex=rf"^listener\..*\.ssl\.{name}$")
    return sum(value for value in stats.values() if isinstance(value, int))


async def assert_envoy_holds(envoy: EnvoyProcess, serial: int, uri: str, root_serial: int) -> None:
    """/certs shows exactly this leaf (serial, SPIFFE URI) and trusts only this root."""
    mine = await own_certs(envoy)
    assert {(cert.serial, cert.uris) for cert in mine} == {(serial, (uri,))}
    roots = await ca_certs(envoy)
    assert {cert.serial for cert in roots} == {root_serial}


async def assert_client_cluster_verified(pair: MtlsPair) -> None:
    """The client Envoy's mTLS cluster handshook, with no connection or verification failure."""
    stats = await pair.client.stats(regex=rf"^cluster\.{SERVER_CLUSTER}\.ssl\.")
    prefix = f"cluster.{SERVER_CLUSTER}.ssl."
    assert int(stats[prefix + "handshake"]) >= 1
    failures = ("connection_error", "fail_verify_error", "fail_verify_san", "fail_verify_no_cert")
    assert {name: stats[prefix + name] for name in failures} == dict.fromkeys(failures, 0)
