"""The DER of the leaves pilot's CA issues, assembled around a template.

cryptography's `CertificateBuilder` spends as long again as the ECDSA signature
itself on each leaf: it reads every field and extension back through Python
objects, encodes them, and parses the certificate it made. Yet one workload leaf
differs from the next only in its serial number, validity, key and SAN; the
rest (version, issuer, signature algorithm, four of its six extensions) is the
same bytes every time. `LeafTemplate` keeps those bytes, encoded once when the
CA loads (by cryptography's own encoders where it has one), and assembles each
leaf's TBSCertificate around the parts that change; the CA signs that with
cryptography and `LeafTemplate.certificate` wraps it. For the same fields the
TBSCertificate is byte for byte the one cryptography's builder makes
(tests/unit/test_leaf_der.py holds it there).

Only the DER forms a leaf needs are written here (X.690): lengths, INTEGER,
UTCTime and GeneralizedTime as RFC 5280 4.1.2.5 asks, OBJECT IDENTIFIER,
SEQUENCE, OCTET and BIT STRING; and, to read a leaf back, the elements of a
SEQUENCE.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import math
from collections.abc import Sequence

from cryptography import x509

SEQUENCE, OCTET_STRING, BIT_STRING, INTEGER, OID = 0x30, 0x04, 0x03, 0x02, 0x06
UTC_TIME, GENERALIZED_TIME, URI_NAME, EXTENSIONS = 0x17, 0x18, 0x86, 0xA3
_VERSION_3 = b"\xa0\x03\x02\x01\x02"  # [0] EXPLICIT INTEGER 2
_EMPTY_NAME = b"\x30\x00"  # a leaf's subject: its identity is in the SAN
_CRITICAL = b"\x01\x01\xff"  # BOOLEAN TRUE (FALSE is the default, left out)
_SAN = b"\x06\x03\x55\x1d\x11"  # 2.5.29.17
# A SubjectKeyIdentifier extension up to its 20-byte SHA-1 (2.5.29.14, an OCTET STRING
# holding an OCTET STRING): the same for every leaf.
_SUBJECT_KEY_ID = b"\x30\x1d\x06\x03\x55\x1d\x0e\x04\x16\x04\x14"
# Where a v3 TBSCertificate holds its key: after version, serial, signature algorithm,
# issuer, validity and subject.
_SPKI_INDEX = 6


def tlv(tag: int, body: bytes) -> bytes:
    """One DER element: tag, definite length, body (tags below 31 only)."""
    size = len(body)
    if size < 0x80:
        return bytes((tag, size)) + body
    length = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(length))) + length + body


def integer(value: int) -> bytes:
    """A non-negative INTEGER, in its fewest octets (a leading zero keeps it positive)."""
    if value < 0:
        raise ValueError("only non-negative integers are encoded here")
    return tlv(INTEGER, value.to_bytes(value.bit_length() // 8 + 1, "big"))


def time(moment: datetime.datetime) -> bytes:
    """RFC 5280's Time: UTCTime through 2049, GeneralizedTime after; whole seconds, UTC."""
    if moment.tzinfo is not None:  # a naive one is UTC already, as cryptography reads it
        moment = moment.astimezone(datetime.UTC)
    year = moment.year
    if 1950 <= year < 2050:
        tag, digits = UTC_TIME, f"{year % 100:02d}"
    else:
        tag, digits = GENERALIZED_TIME, f"{year:04d}"
    stamp = f"{digits}{moment.month:02d}{moment.day:02d}{moment.hour:02d}{moment.minute:02d}"
    return tlv(tag, f"{stamp}{moment.second:02d}Z".encode())


def object_identifier(dotted: str) -> bytes:
    """An OBJECT IDENTIFIER from its dotted form."""
    first, second, *rest = (int(arc) for arc in dotted.split("."))
    body = bytearray()
    for arc in (40 * first + second, *rest):
        chunk, left = [arc & 0x7F], arc >> 7
        while left:  # base 128, most significant first, the high bit on all but the last
            chunk.append(0x80 | (left & 0x7F))
            left >>= 7
        body += bytes(reversed(chunk))
    return tlv(OID, bytes(body))


def elements(der: bytes) -> list[bytes]:
    """The whole elements (tag, length and body) inside one constructed element.

    Raises ValueError on anything that is not well-formed definite-length DER.
    """
    start, end = _body(der, 0)
    found = []
    while start < end:
        _, inner_end = _body(der, start)
        if inner_end > end:
            raise ValueError("an element runs past the end of its parent")
        found.append(der[start:inner_end])
        start = inner_end
    return found


def _body(der: bytes, at: int) -> tuple[int, int]:
    """(start, end) of the element at `at`: where its body starts, and where it ends."""
    if at + 2 > len(der):
        raise ValueError("truncated DER element")
    first = der[at + 1]
    if first < 0x80:
        start, size = at + 2, first
    else:
        count = first & 0x7F
        if not 0 < count <= 4 or at + 2 + count > len(der):
            raise ValueError("bad DER length")
        start = at + 2 + count
        size = int.from_bytes(der[at + 2 : start], "big")
    if start + size > len(der):
        raise ValueError("truncated DER element")
    return start, start + size


def certified_key(certificate: bytes) -> bytes:
    """The SubjectPublicKeyInfo a DER certificate (v3) certifies, as encoded in it.

    Walked to, not split into lists: every mint reads it back.
    """
    at, _ = _body(certificate, 0)  # the Certificate's body: its TBSCertificate first
    at, _ = _body(certificate, at)  # the TBSCertificate's body
    for _ in range(_SPKI_INDEX):
        at = _body(certificate, at)[1]
    return certificate[at : _body(certificate, at)[1]]


def key_identifier(spki: bytes) -> bytes:
    """RFC 5280 4.2.1.2 method 1: SHA-1 of the subjectPublicKey bits (as cryptography's
    `SubjectKeyIdentifier.from_public_key`)."""
    at, _ = _body(spki, 0)
    _, algorithm_end = _body(spki, at)
    bits_start, bits_end = _body(spki, algorithm_end)  # after its count of unused bits
    return hashlib.sha1(spki[bits_start + 1 : bits_end], usedforsecurity=False).digest()


def uri_names(uri: str) -> bytes:
    """The SubjectAlternativeName value naming one URI (an identity: ASCII)."""
    return tlv(SEQUENCE, tlv(URI_NAME, uri.encode("ascii")))


def pem(label: str, der: bytes) -> str:
    """PEM as cryptography and OpenSSL write it: 64 characters a line."""
    encoded = base64.b64encode(der).decode()
    lines = "\n".join(encoded[i : i + 64] for i in range(0, len(encoded), 64))
    return f"-----BEGIN {label}-----\n{lines}\n-----END {label}-----\n"


def extension(extension: x509.Extension[x509.ExtensionType]) -> bytes:
    """An Extension, its value encoded by cryptography."""
    value = extension.value.public_bytes()
    return _extension(object_identifier(extension.oid.dotted_string), extension.critical, value)


def _extension(oid: bytes, critical: bool, value: bytes) -> bytes:
    return tlv(SEQUENCE, oid + (_CRITICAL if critical else b"") + tlv(OCTET_STRING, value))


class LeafTemplate:
    """The bytes every leaf of one issuer shares, and the assembly of the rest.

    The extensions come in a leaf in this order: the SAN (critical), the `fixed`
    ones, the SubjectKeyIdentifier of its own key, then `authority`.
    """

    def __init__(
        self,
        issuer: x509.Certificate,
        signature_algorithm: bytes,
        fixed: Sequence[x509.Extension[x509.ExtensionType]],
        authority: x509.Extension[x509.ExtensionType],
    ) -> None:
        tbs = elements(issuer.tbs_certificate_bytes)
        # The issuer's subject as encoded in its own certificate: byte for byte what a
        # verifier compares the leaf's issuer with.
        self._issuer = tbs[5] if tbs[0][0] == 0xA0 else tbs[4]
        self.signature_algorithm = signature_algorithm
        self._fixed = b"".join(extension(e) for e in fixed)
        self._authority = extension(authority)
        self._validity: tuple[object, bytes] = (None, b"")

    def tbs(
        self,
        serial: int,
        validity: tuple[datetime.datetime, datetime.datetime],
        spki: bytes,
        san: bytes,
    ) -> bytes:
        """The TBSCertificate of a leaf: `spki` its key, `san` its SubjectAltName value."""
        extensions = (
            _extension(_SAN, True, san)
            + self._fixed
            + _SUBJECT_KEY_ID
            + key_identifier(spki)
            + self._authority
        )
        body = (
            _VERSION_3
            + integer(serial)
            + self.signature_algorithm
            + self._issuer
            + self._validity_of(*validity)
            + _EMPTY_NAME
            + spki
            + tlv(EXTENSIONS, tlv(SEQUENCE, extensions))
        )
        return tlv(SEQUENCE, body)

    def certificate(self, tbs: bytes, signature: bytes) -> bytes:
        """The Certificate: its TBSCertificate, the algorithm, and the signature over it."""
        signed = tbs + self.signature_algorithm + tlv(BIT_STRING, b"\x00" + signature)
        return tlv(SEQUENCE, signed)

    def _validity_of(self, not_before: datetime.datetime, not_after: datetime.datetime) -> bytes:
        """The Validity, remembered for the last second asked: a burst shares it.

        Read and replaced whole, as one tuple: minting threads may ask at once.
        """
        seconds = (math.floor(not_before.timestamp()), math.floor(not_after.timestamp()))
        asked, encoded = self._validity
        if asked != seconds:
            encoded = tlv(SEQUENCE, time(not_before) + time(not_after))
            self._validity = (seconds, encoded)
        return encoded
