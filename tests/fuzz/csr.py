"""Certificate signing requests as a hostile node agent might send them.

`build_csr` makes a PEM CSR from a key of some kind (a small pool, generated once:
RSA is slow to make), a subject common name, subject alternative names of every
kind, then `mangle`s it: truncated, a flipped byte, two CSRs, the wrong PEM label,
no armour, padded past pilot's 16 KiB limit.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
from collections.abc import Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from cryptography.x509.oid import NameOID

KEY_KINDS = ("ec-p256", "ec-p384", "rsa-2048", "rsa-1024", "ed25519", "dsa-2048")
SAN_KINDS = ("uri", "dns", "ip", "email")
MANGLES = (
    "none",
    "truncate",
    "flip",
    "twice",
    "certificate-label",
    "no-armour",
    "padded",
    "crlf",
    "empty",
)


@functools.cache
def key(kind: str) -> Any:
    """One private key of each kind, made on first use."""
    if kind == "ec-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if kind == "ec-p384":
        return ec.generate_private_key(ec.SECP384R1())
    if kind.startswith("rsa-"):
        return rsa.generate_private_key(65537, int(kind.split("-")[1]))
    if kind == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    return dsa.generate_private_key(2048)


def _general_name(kind: str, value: str) -> x509.GeneralName | None:
    """The SAN, or None where cryptography itself refuses the value."""
    try:
        return _san(kind, value)
    except ValueError:
        return None


def _san(kind: str, value: str) -> x509.GeneralName:
    if kind == "uri":
        return x509.UniformResourceIdentifier(value)
    if kind == "dns":
        return x509.DNSName(value)
    if kind == "email":
        return x509.RFC822Name(value)
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        return x509.IPAddress(ipaddress.ip_address("10.0.0.1"))


def build_csr(
    key_kind: str, common_name: str | None, sans: Sequence[tuple[str, str]], mangle: str
) -> str:
    """A PEM CSR signed by a `key_kind` key, then mangled."""
    private = key(key_kind)
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else []
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(subject))
    general = [n for n in (_general_name(kind, value) for kind, value in sans) if n is not None]
    if general:
        builder = builder.add_extension(x509.SubjectAlternativeName(general), critical=False)
    algorithm = None if key_kind == "ed25519" else hashes.SHA256()
    pem = builder.sign(private, algorithm).public_bytes(serialization.Encoding.PEM).decode()
    return _mangle(pem, mangle)


def _mangle(pem: str, how: str) -> str:
    if how == "truncate":
        return pem[: len(pem) // 2]
    if how == "flip":
        body = bytearray(_der(pem))
        body[len(body) * 2 // 3] ^= 0x01
        return _armour(bytes(body), "CERTIFICATE REQUEST")
    if how == "twice":
        return pem + pem
    if how == "certificate-label":
        return _armour(_der(pem), "CERTIFICATE")
    if how == "no-armour":
        return base64.b64encode(_der(pem)).decode()
    if how == "padded":
        return pem + "\n" + "A" * 17_000
    if how == "crlf":
        return pem.replace("\n", "\r\n")
    if how == "empty":
        return ""
    return pem


def _der(pem: str) -> bytes:
    lines = [line for line in pem.strip().splitlines() if not line.startswith("-----")]
    return base64.b64decode("".join(lines))


def _armour(der: bytes, label: str) -> str:
    text = base64.b64encode(der).decode()
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----\n"
