"""Secrets decoded for tests without ever keeping a private key printable.

Owns `WorkloadCert`: a `default` secret read into what tests compare (serial,
SANs, validity, a fingerprint of the key and whether it is the leaf's), and the
readers that produce it from a `Secret` (`workload_cert`, `root_of`), from what a
stream of the xDS test client received (`workload_in`, `root_in`,
`workloads_received`) or from pilot's SecretManager (`served_workload`). The
private key is hashed and checked against the leaf, then forgotten: neither the key
nor a `Secret` message may reach an assertion message, nor the arguments of the
frame a failed check raises from (checks fail through `_fail`).
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any, NoReturn

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2

from pilot.generators.sds import workload_secret
from pilot.security.secrets import SecretManager
from pilot.xds.proxy import ProxyKey
from tests.support.proxies import Proxy
from tests.support.xds_client import SECRET, Arrived, DeltaStream, SotwStream, response_resources

WORKLOAD = "default"
ROOT = "ROOTCA"


def _spki(public_key: Any) -> bytes:
    der: bytes = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def uri_sans(certificate: x509.Certificate) -> tuple[str, ...]:
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


def _fail(message: str) -> NoReturn:
    """Fail a check from a frame whose only argument is the message, not the secret."""
    raise AssertionError(message)


def _key_facts(key_pem: bytes, leaf_spki: bytes) -> tuple[str, bool]:
    """(SHA-256 of the key PEM, whether the key is the leaf's): all a test keeps of a key."""
    private_key = serialization.load_pem_private_key(key_pem, password=None)
    return hashlib.sha256(key_pem).hexdigest(), _spki(private_key.public_key()) == leaf_spki


def workload_cert(secret: secret_pb2.Secret) -> WorkloadCert:
    """Read a `default` secret; its key is hashed and checked against the leaf, then forgotten."""
    if secret.name != WORKLOAD:
        _fail(f"expected the {WORKLOAD!r} secret, got {secret.name!r}")
    if not secret.HasField("tls_certificate"):
        _fail("the default secret has no tls_certificate")
    tls = secret.tls_certificate
    if not tls.private_key.inline_bytes:
        _fail("the default secret has no inline private key")
    if not tls.certificate_chain.inline_bytes:
        _fail("the default secret has no certificate chain")
    chain = tuple(x509.load_pem_x509_certificates(tls.certificate_chain.inline_bytes))
    leaf = chain[0]
    leaf_spki = _spki(leaf.public_key())
    key_id, key_matches_leaf = _key_facts(tls.private_key.inline_bytes, leaf_spki)
    return WorkloadCert(
        serial=leaf.serial_number,
        uris=uri_sans(leaf),
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
    if secret.name != ROOT:
        _fail(f"expected the {ROOT!r} secret, got {secret.name!r}")
    if not secret.HasField("validation_context"):
        _fail("ROOTCA has no validation_context")
    return str(secret.validation_context.trusted_ca.inline_bytes.decode())


def served_workload(secrets: SecretManager, proxy: Proxy | ProxyKey) -> WorkloadCert | None:
    """What pilot's SecretManager keeps for a proxy as `default` right now (None: nothing)."""
    key = proxy if isinstance(proxy, ProxyKey) else ProxyKey(proxy.node_id, proxy.uri)
    certificate = secrets.current(key)
    if certificate is None:
        return None
    return workload_cert(secret_pb2.Secret.FromString(workload_secret(certificate).payload))


def workload_in(arrived: Arrived) -> WorkloadCert:
    """The `default` secret among what a stream's `ack_until` received."""
    return workload_cert(arrived[WORKLOAD])


def root_in(arrived: Arrived) -> str:
    """The trusted CA PEM of the `ROOTCA` secret among what `ack_until` received."""
    return root_of(arrived[ROOT])


def workloads_received(stream: SotwStream | DeltaStream) -> list[WorkloadCert]:
    """Every `default` secret the stream has read so far, in order."""
    found = []
    for response in stream.received:
        if response.type_url == SECRET:
            resources = response_resources(response)
            if WORKLOAD in resources:
                found.append(workload_cert(resources[WORKLOAD]))
    return found
