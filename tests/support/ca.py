"""Shared pieces of the CA and authentication tests (`test_ca_*.py`).

Owns:

* `kube_api`: a started test API server (TokenReview) and a kubeconfig pointing at it;
* `CaCaller`: a client of `istio.v1.auth.IstioCertificateService/CreateCertificate`
  over a real gRPC channel, with the generated messages, as a node agent calls it;
* `record_signatures`: a spy on one pilot's `CertificateAuthority.issue_workload`, so that a
  test can say "nothing was signed";
* `node`: an Envoy node claiming an identity in Istio's metadata, for the xDS test
  client (`tests.support.xds_client`);
* `FakeIstioCa`: a small Istio-protocol CA (grpc.aio) that records each request and
  signs with its own root, can be stopped and started on the same port, serve TLS,
  and answer broken chains on purpose;
* certificate builders (`new_ca`, `issue_leaf`, `write_plugged_in`) and readers
  (`load_chain`, `san_uris`, `assert_issued_chain`).

Tokens and private keys are never put in reprs or assertion messages: tokens travel
as `Token` (a str whose repr is redacted, since pytest prints the arguments of
failing frames), records that hold one keep it out of `repr`, and callers compare
them into a boolean first.
"""

from __future__ import annotations

import datetime
import enum
import ipaddress
import itertools
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc
import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from envoy.config.core.v3 import base_pb2

from pilot._gen.istio.v1.auth import ca_pb2
from pilot.security.ca import CertificateAuthority, Leaf
from pilot.security.identity import Identity
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.xds_client import node as envoy_node

CA_SERVICE = "istio.v1.auth.IstioCertificateService"
CREATE_CERTIFICATE = f"/{CA_SERVICE}/CreateCertificate"
FETCH_CLUSTERS = "/envoy.service.cluster.v3.ClusterDiscoveryService/FetchClusters"
IMPERSONATED = "ImpersonatedIdentity"
TRUST_DOMAIN = "cluster.local"


class Token(str):
    """A bearer token whose repr never shows it (pytest prints arguments in tracebacks)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Token(<redacted>)"


def sa_token(
    srv: KubeAPIServer,
    namespace: str,
    service_account: str,
    audiences: tuple[str, ...] = ("istio-ca",),
) -> Token:
    """A service-account token the test API server's TokenReview accepts."""
    return Token(srv.add_service_account_token(namespace, service_account, audiences=audiences))


def spiffe(namespace: str, service_account: str, trust_domain: str = TRUST_DOMAIN) -> str:
    """The SPIFFE URI Istio gives a service account."""
    return Identity(trust_domain, namespace, service_account).uri


# ------------------------------------------------------------------ API server


@asynccontextmanager
async def kube_api(tmp_path: Path) -> AsyncIterator[tuple[KubeAPIServer, Path]]:
    """A running test API server (it answers TokenReviews) and a kubeconfig for it."""
    async with KubeAPIServer() as srv:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig.yaml", srv.url)
        yield srv, kubeconfig


def reviews(srv: KubeAPIServer) -> list[tuple[tuple[str, ...], bool, str | None]]:
    """The TokenReviews the API server answered, without their tokens."""
    return [(tuple(r.audiences), r.authenticated, r.username) for r in srv.token_reviews]


# ------------------------------------------------------------------ certificates


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class Issuer:
    """A CA certificate and its key."""

    key: ec.EllipticCurvePrivateKey = field(repr=False)
    cert: x509.Certificate

    @property
    def cert_pem(self) -> str:
        return pem(self.cert)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


def pem(certificate: x509.Certificate) -> str:
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def _ca_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(
    common_name: str,
    parent: Issuer | None = None,
    valid_for: datetime.timedelta = datetime.timedelta(days=30),
    *,
    starts: datetime.datetime | None = None,
    is_ca: bool = True,
    path_length: int | None = None,
    usage: x509.KeyUsage | None = None,
    subject_key_id: bool = True,
) -> Issuer:
    """A self-signed root, or an intermediate signed by `parent`, valid for `valid_for`
    from `starts` (default: from now, backdated five minutes). The keywords make faulty ones:
    `is_ca=False`, a `usage` other than keyCertSign and cRLSign, no SubjectKeyIdentifier."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ca tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
    issuer_name = parent.cert.subject if parent else name
    signing_key = parent.key if parent else key
    now = utcnow()
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(starts or now - datetime.timedelta(minutes=5))
        .not_valid_after((starts or now) + valid_for)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=path_length), critical=True)
        .add_extension(usage or _ca_usage(), critical=True)
    )
    if subject_key_id:
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    if parent is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(parent.key.public_key()),
            critical=False,
        )
    return Issuer(key, builder.sign(signing_key, hashes.SHA256()))


def issue_leaf(
    issuer: Issuer,
    public_key: Any,
    uris: Sequence[str] = (),
    *,
    valid_for: datetime.timedelta = datetime.timedelta(hours=1),
    hosts: Sequence[str] = (),
    signing_key: ec.EllipticCurvePrivateKey | None = None,
    starts: datetime.datetime | None = None,
) -> x509.Certificate:
    """A leaf for `public_key` naming `issuer` (signed by `signing_key` if given, to forge),
    valid from `starts` (default a minute ago) for `valid_for`."""
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    start = starts or utcnow() - datetime.timedelta(minutes=1)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(issuer.cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + valid_for)
        .add_extension(x509.SubjectAlternativeName(names), critical=True)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(signing_key or issuer.key, hashes.SHA256())
    )


def make_csr(uris: Sequence[str] = ()) -> tuple[ec.EllipticCurvePrivateKey, bytes]:
    """A fresh P-256 key and a PEM CSR asking for these URI SANs."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    if uris:
        names = [x509.UniformResourceIdentifier(u) for u in uris]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    csr = builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    return key, csr


def public_der(key: Any) -> bytes:
    """A public key (or the public half of a private key) as DER SubjectPublicKeyInfo."""
    public = key.public_key() if hasattr(key, "private_bytes") else key
    der: bytes = public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def load_chain(chain: Iterable[str] | str | bytes) -> list[x509.Certificate]:
    """Every certificate in a PEM chain (a list of PEM strings, or one blob)."""
    if isinstance(chain, str | bytes):
        blob = chain.encode() if isinstance(chain, str) else chain
        return x509.load_pem_x509_certificates(blob)
    return [c for item in chain for c in x509.load_pem_x509_certificates(item.encode())]


def san_uris(certificate: x509.Certificate) -> list[str]:
    try:
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return list(extension.value.get_values_for_type(x509.UniformResourceIdentifier))


def assert_issued_chain(certificates: Sequence[x509.Certificate], root: x509.Certificate) -> None:
    """Each certificate is issued (and signed) by the next, and the last one is `root`."""
    assert certificates, "empty chain"
    for position, (child, parent) in enumerate(itertools.pairwise(certificates)):
        try:
            child.verify_directly_issued_by(parent)
        except (ValueError, TypeError, InvalidSignature) as error:
            pytest.fail(f"chain[{position}] is not issued by chain[{position + 1}]: {error!r}")
    last = certificates[-1]
    assert last == root, (
        f"the chain ends in {last.subject.rfc4514_string()!r}, "
        f"not the expected root {root.subject.rfc4514_string()!r}"
    )


@dataclass(frozen=True)
class PluggedIn:
    """A root and an intermediate written in Istio's plugged-in CA layout."""

    directory: Path
    root: Issuer
    intermediate: Issuer


def write_plugged_in(
    directory: Path,
    chain_has_root: bool = True,
    intermediate_valid_for: datetime.timedelta = datetime.timedelta(days=30),
    *,
    root: Issuer | None = None,
    intermediate: Issuer | None = None,
) -> PluggedIn:
    """ca-cert.pem / ca-key.pem (the intermediate), root-cert.pem, cert-chain.pem;
    `root` and `intermediate` made here unless given."""
    root = root or new_ca("plugged-in root")
    intermediate = intermediate or new_ca(
        "plugged-in intermediate", root, valid_for=intermediate_valid_for
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca-cert.pem").write_text(intermediate.cert_pem)
    (directory / "ca-key.pem").write_bytes(intermediate.key_pem)
    (directory / "ca-key.pem").chmod(0o600)
    (directory / "root-cert.pem").write_text(root.cert_pem)
    chain = intermediate.cert_pem + (root.cert_pem if chain_has_root else "")
    (directory / "cert-chain.pem").write_text(chain)
    return PluggedIn(directory, root, intermediate)


def write_state_dir(directory: Path, root: Issuer) -> Path:
    """A `--ca-state-dir` as pilot leaves it (0700, files 0600), holding `root`."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    for name, data in (("root-cert.pem", root.cert_pem.encode()), ("root-key.pem", root.key_pem)):
        (directory / name).write_bytes(data)
        (directory / name).chmod(0o600)
    return directory


# ------------------------------------------------------------------ pilot's CA API


class CaCaller:
    """A node agent's view of pilot's (or any) Istio CA: one channel, CreateCertificate."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._channel = grpc.aio.insecure_channel(target)
        self._call = self._channel.unary_unary(
            CREATE_CERTIFICATE,
            request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
            response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._channel.close(None)

    async def create(
        self,
        csr: bytes | str,
        *,
        token: str | None = None,
        validity: int = 0,
        impersonate: str | None = None,
    ) -> list[str]:
        """The signed chain; raises grpc.aio.AioRpcError when refused."""
        request = ca_pb2.IstioCertificateRequest(
            csr=csr.decode() if isinstance(csr, bytes) else csr, validity_duration=validity
        )
        if impersonate is not None:
            request.metadata.fields[IMPERSONATED].string_value = impersonate
        metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
        response = await self._call(request, metadata=metadata, timeout=10)
        return list(response.cert_chain)


def record_signatures(monkeypatch: pytest.MonkeyPatch, ca: CertificateAuthority) -> list[str]:
    """From now on, the identity of every workload certificate `ca` issues is appended to
    the list: for a CSR (`sign`) or for a key pilot made itself (`LocalCa.mint`), both of
    which issue the leaf through `issue_workload`."""
    signed: list[str] = []
    original = ca.issue_workload

    def issue_workload(spki: bytes, identity: Identity, ttl: datetime.timedelta) -> Leaf:
        leaf = original(spki, identity, ttl)
        signed.append(identity.uri)
        return leaf

    monkeypatch.setattr(ca, "issue_workload", issue_workload)
    return signed


# ------------------------------------------------------------------ xDS node


def node(
    node_id: str, namespace: str | None = None, service_account: str | None = None
) -> base_pb2.Node:
    """An Envoy node, with Istio's NAMESPACE / SERVICE_ACCOUNT metadata where given."""
    claimed = {"NAMESPACE": namespace, "SERVICE_ACCOUNT": service_account}
    return envoy_node(node_id, {k: v for k, v in claimed.items() if v is not None})


# ------------------------------------------------------------------ a CA of our own


class Fault(enum.Enum):
    """What the fake CA gets wrong on purpose."""

    NONE = "none"
    LEAF_NOT_SIGNED_BY_ROOT = "leaf-not-signed-by-root"  # chain [leaf, root], leaf forged
    OTHER_ROOT = "other-root"  # a consistent chain, but under a root pilot does not trust
    WRONG_IDENTITY = "wrong-identity"  # signs for another SPIFFE identity than asked
    LONG_CHAIN = "long-chain"  # a chain that verifies, its root repeated: 11 certificates
    HUGE_ANSWER = "huge-answer"  # the same, the root repeated to 1 MiB


@dataclass(frozen=True)
class CaCall:
    """One CreateCertificate request the fake CA received."""

    authorization: str | None = field(repr=False)  # holds the token: never printed
    impersonated: str | None
    request_metadata: dict[str, str]
    csr_uris: list[str]
    validity_duration: int
    caller: str | None  # the identity the token maps to


class FakeIstioCa:
    """An Istio-protocol CA on a port of its own, recording each request.

    Callers authenticate with one of `tokens` (token -> SPIFFE identity); the
    certificate names `ImpersonatedIdentity` if sent, else the caller. Signs
    with its own root; `fault` makes it answer something pilot must refuse.
    """

    def __init__(self, tokens: Mapping[str, str], tls: bool = False) -> None:
        self.tokens = dict(tokens)
        self.tls = tls
        self.root = new_ca("fake istio CA root")
        self.other = new_ca("someone else's root")
        self.fault = Fault.NONE
        self.calls: list[CaCall] = []
        self.signed: list[list[str]] = []
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._serving_key = ec.generate_private_key(ec.SECP256R1())
        self._serving_cert = issue_leaf(
            self.root,
            self._serving_key.public_key(),
            hosts=("127.0.0.1", "localhost"),
            valid_for=datetime.timedelta(days=1),
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def root_pem(self) -> str:
        return self.root.cert_pem

    async def start(self) -> None:
        """Listen (again) on the same port; the first start picks a free one."""
        assert self._server is None, "already running"
        server = grpc.aio.server()
        method = grpc.unary_unary_rpc_method_handler(
            self._create,
            request_deserializer=ca_pb2.IstioCertificateRequest.FromString,
            response_serializer=ca_pb2.IstioCertificateResponse.SerializeToString,
        )
        handler = grpc.method_handlers_generic_handler(CA_SERVICE, {"CreateCertificate": method})
        server.add_generic_rpc_handlers((handler,))
        address = f"127.0.0.1:{self.port}"
        if self.tls:
            key = self._serving_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            credentials = grpc.ssl_server_credentials([(key, pem(self._serving_cert).encode())])
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        assert port != 0, f"cannot listen on {address}"
        self.port = port
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Go away: close the port, cut calls in flight."""
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _create(self, request: Any, context: Any) -> Any:
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        authorization = metadata.get("authorization")
        scheme, _, token = (authorization or "").partition(" ")
        caller = self.tokens.get(token) if scheme == "Bearer" else None
        fields = request.metadata.fields
        impersonated = fields[IMPERSONATED].string_value if IMPERSONATED in fields else None
        try:
            csr = x509.load_pem_x509_csr(request.csr.encode())
        except ValueError:
            csr = None
        self.calls.append(
            CaCall(
                authorization=authorization,
                impersonated=impersonated,
                request_metadata={k: v.string_value for k, v in fields.items()},
                csr_uris=_csr_uris(csr) if csr is not None else [],
                validity_duration=request.validity_duration,
                caller=caller,
            )
        )
        if caller is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
        if csr is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad CSR")
        assert csr is not None and caller is not None
        identity = impersonated or caller
        if self.fault is Fault.WRONG_IDENTITY:
            identity = spiffe("somewhere-else", "someone-else")
        valid_for = datetime.timedelta(seconds=request.validity_duration or 3600)
        issuer = self.other if self.fault is Fault.OTHER_ROOT else self.root
        forger = self.other.key if self.fault is Fault.LEAF_NOT_SIGNED_BY_ROOT else None
        leaf = issue_leaf(
            issuer, csr.public_key(), [identity], valid_for=valid_for, signing_key=forger
        )
        chain = [pem(leaf), issuer.cert_pem]
        if self.fault is Fault.LONG_CHAIN:
            chain += [issuer.cert_pem] * 9
        elif self.fault is Fault.HUGE_ANSWER:
            chain += [issuer.cert_pem] * ((1 << 20) // len(issuer.cert_pem))
        self.signed.append(chain)
        return ca_pb2.IstioCertificateResponse(cert_chain=chain)


def _csr_uris(csr: x509.CertificateSigningRequest) -> list[str]:
    try:
        extension = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return list(extension.value.get_values_for_type(x509.UniformResourceIdentifier))
