"""Keys, CSRs and certificates (cryptography); the CPU-heavy parts run off the event loop.

Private keys only ever leave this module as PEM bytes handed to their one
consumer; nothing here logs them, and files holding them are written 0600.
"""

from __future__ import annotations

import datetime
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificatePublicKeyTypes,
    PrivateKeyTypes,
)
from cryptography.x509.oid import NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class KeyType(StrEnum):
    """`--key-type`: ECDSA P-256 (default) or RSA 2048."""

    EC = "ec"
    RSA = "rsa"


@dataclass(frozen=True, slots=True)
class WorkloadCertificate:
    """A signed chain (leaf first) and its private key; the key never in a repr."""

    chain_pem: bytes
    key_pem: bytes = field(repr=False)
    serial: int
    expires: datetime.datetime


def generate_key(key_type: KeyType) -> PrivateKey:
    if key_type is KeyType.RSA:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_key_der(key: CertificatePublicKeyTypes) -> bytes:
    """A public key as a certificate carries it: its DER SubjectPublicKeyInfo."""
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def make_csr(key: PrivateKey, uris: Sequence[str]) -> bytes:
    """A PEM CSR asking for these SPIFFE URIs as SANs."""
    names = [x509.UniformResourceIdentifier(uri) for uri in uris]
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=True)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def new_key_and_csr(key_type: KeyType, uris: Sequence[str]) -> tuple[bytes, bytes]:
    """(private key PEM, CSR PEM): the slow part of minting, run in a thread."""
    key = generate_key(key_type)
    return key_pem(key), make_csr(key, uris)


def load_certificates(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def cert_pem(certificate: x509.Certificate) -> str:
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def key_matches(key: PrivateKeyTypes, certificate: x509.Certificate) -> bool:
    """True when `certificate` certifies the public half of `key`."""
    # Public keys compare by value (type, curve or modulus, point or exponent),
    # as their DER encodings would, without encoding either.
    return bool(key.public_key() == certificate.public_key())


def uri_sans(certificate: x509.Certificate) -> list[str]:
    try:
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return extension.value.get_values_for_type(x509.UniformResourceIdentifier)


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def self_signed_root(trust_domain: str, years: int = 10) -> tuple[PrivateKey, x509.Certificate]:
    """A new root CA for a trust domain."""
    key = generate_key(KeyType.EC)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, trust_domain),
            x509.NameAttribute(NameOID.COMMON_NAME, "pilot root CA"),
        ]
    )
    now = utcnow()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=2))
        .not_valid_after(now + datetime.timedelta(days=365 * years))
        # It signs leaves only: no CA certificate may come between it and a leaf.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner may read: 0600 from its first byte whatever the umask,
    replaced atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)  # the umask may have taken bits away
        handle.write(data)
    tmp.replace(path)


def verify_chain(chain: Sequence[x509.Certificate], roots: Sequence[x509.Certificate]) -> None:
    """Check that each certificate is signed by the next and the last by a trusted root.

    Raises ValueError with the reason; used on chains a remote CA returns.
    """
    if not chain:
        raise ValueError("empty certificate chain")
    now = utcnow()
    for certificate in chain:
        if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
            raise ValueError(
                f"certificate {certificate.subject.rfc4514_string()!r} is not valid now"
            )
    for child, parent in itertools.pairwise(chain):
        _verify_signed_by(child, parent)
    last = chain[-1]
    if last in roots:
        return
    for root in roots:
        try:
            _verify_signed_by(last, root)
        except ValueError:
            continue
        return
    raise ValueError("certificate chain does not lead to a trusted root")


def _verify_signed_by(child: x509.Certificate, parent: x509.Certificate) -> None:
    try:
        child.verify_directly_issued_by(parent)
    except (ValueError, TypeError, InvalidSignature) as error:
        raise ValueError(f"certificate not issued by the next in the chain: {error}") from error
