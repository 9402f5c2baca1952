"""Leaves assembled from the CA's template (`pilot.security.leaf_der`) are cryptography's own.

- For any identity, key (EC or RSA), serial and validity, and for each kind of
  CA pilot signs with (its self-signed EC root, a plugged-in EC intermediate,
  a plugged-in RSA intermediate whose subject mixes string types and whose
  issuer has no SubjectKeyIdentifier), the TBSCertificate is byte for byte the
  one `x509.CertificateBuilder` makes from the same fields; the signature
  verifies under the CA's key; the PEM, serial and expiry handed out are the
  certificate's.
- Time switches from UTCTime to GeneralizedTime in 2050, as RFC 5280 asks.
- Reading a certificate back never fails other than with ValueError, whatever
  the bytes.
"""

from __future__ import annotations

import contextlib
import datetime
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot.security import ca as ca_module
from pilot.security import leaf_der
from pilot.security.ca import CaSettings, CertificateAuthority, Leaf
from pilot.security.certs import PrivateKey, public_key_der
from pilot.security.identity import MAX_LABEL, MAX_SUBDOMAIN, Identity
from tests.support.ca import Issuer, new_ca

DAY = datetime.timedelta(days=1)
LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)
IDENTITIES = st.builds(
    Identity,
    st.sampled_from(["cluster.local", "example.org", "a" * MAX_LABEL + ".mesh"]),
    LABEL.filter(lambda name: len(name) <= MAX_LABEL),
    st.lists(LABEL, min_size=1, max_size=5)
    .map(".".join)
    .filter(lambda name: len(name) <= MAX_SUBDOMAIN),
)
SERIALS = st.integers(min_value=1, max_value=2**159 - 1)
MOMENTS = st.datetimes(
    min_value=datetime.datetime(1950, 1, 1),
    max_value=datetime.datetime(9998, 12, 31),
    timezones=st.just(datetime.UTC),
)


@dataclass(frozen=True)
class Signer:
    """A CertificateAuthority and what a reference leaf needs of it."""

    ca: CertificateAuthority
    key: PrivateKey
    cert: x509.Certificate


@cache
def _leaf_keys() -> tuple[PrivateKey, ...]:
    """Keys leaves certify: P-256 (pilot's default), P-384 (a CSR's), RSA 2048."""
    return (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP384R1()),
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
    )


@cache
def _signers() -> dict[str, Signer]:
    root = new_ca("leaf template root", valid_for=3650 * DAY)
    intermediate = new_ca("leaf template intermediate", parent=root, valid_for=365 * DAY)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_cert = _rsa_intermediate(rsa_key, root)
    own = CertificateAuthority.load(
        CaSettings(state_dir=Path(tempfile.mkdtemp(prefix="leaf-der-")) / "ca")
    )
    return {
        "pilot's self-signed root": Signer(own, own._key, own.signing_cert),
        "plugged-in EC intermediate": Signer(
            _authority(intermediate.key, intermediate.cert, root.cert),
            intermediate.key,
            intermediate.cert,
        ),
        "plugged-in RSA intermediate": Signer(
            _authority(rsa_key, rsa_cert, root.cert), rsa_key, rsa_cert
        ),
    }


def _authority(
    key: PrivateKey, cert: x509.Certificate, root: x509.Certificate
) -> CertificateAuthority:
    return CertificateAuthority(key, cert, [cert, root], root, CaSettings())


def _rsa_intermediate(key: rsa.RSAPrivateKey, root: Issuer) -> x509.Certificate:
    """An RSA CA whose subject has a multi-valued RDN, UTF8String values with non-ASCII
    text and a PrintableString (the country), and no SubjectKeyIdentifier (leaves name it
    by its key's hash)."""
    subject = x509.Name(
        [
            x509.RelativeDistinguishedName(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Bücher & Co"),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "mesh"),
                ]
            ),
            x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COUNTRY_NAME, "DE")]),
            x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COMMON_NAME, "x" * 64)]),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(root.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + 365 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(root.key, hashes.SHA256())
    )


def _reference_tbs(signer: Signer, leaf: x509.Certificate, identity: Identity) -> bytes:
    """The TBSCertificate cryptography's builder makes for the leaf's own fields."""
    public = leaf.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey | rsa.RSAPublicKey)
    extensions = [
        ca_module._extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity.uri)]),
            critical=True,
        ),
        *ca_module._LEAF_FIXED,
        ca_module._extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False),
        ca_module._extension(ca_module._authority_key_id(signer.cert, signer.key), critical=False),
    ]
    builder = x509.CertificateBuilder(
        signer.cert.subject,
        x509.Name([]),
        public,
        leaf.serial_number,
        leaf.not_valid_before_utc,
        leaf.not_valid_after_utc,
        extensions,
    )
    return builder.sign(signer.key, hashes.SHA256()).tbs_certificate_bytes


def _check(signer: Signer, issued: Leaf, spki: bytes, identity: Identity) -> None:
    leaf = x509.load_der_x509_certificate(issued.der)
    assert leaf.tbs_certificate_bytes == _reference_tbs(signer, leaf, identity)
    leaf.verify_directly_issued_by(signer.cert)
    assert public_key_der(leaf.public_key()) == spki == leaf_der.certified_key(issued.der)
    assert issued.pem == leaf.public_bytes(serialization.Encoding.PEM).decode()
    assert (issued.serial, issued.not_after) == (leaf.serial_number, leaf.not_valid_after_utc)


@pytest.mark.parametrize("kind", list(_signers()))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(identity=IDENTITIES, key_index=st.integers(0, 2), ttl_hours=st.integers(1, 24 * 90))
def test_a_leaf_is_byte_for_byte_what_cryptographys_builder_makes(
    kind: str, identity: Identity, key_index: int, ttl_hours: int
) -> None:
    signer = _signers()[kind]
    spki = public_key_der(_leaf_keys()[key_index].public_key())
    issued = signer.ca.issue_workload(spki, identity, datetime.timedelta(hours=ttl_hours))
    _check(signer, issued, spki, identity)


@settings(max_examples=100, deadline=None)
@given(serial=SERIALS, not_before=MOMENTS, lifetime=st.integers(1, 10**9))
def test_any_serial_and_validity_encode_as_cryptography_encodes_them(
    serial: int, not_before: datetime.datetime, lifetime: int
) -> None:
    """Serials of every size (a leading zero when the top bit is set), and times on either
    side of 2050 (UTCTime, then GeneralizedTime), up to year 9999."""
    signer = _signers()["pilot's self-signed root"]
    identity = Identity("cluster.local", "shop", "cart")
    not_after = min(
        not_before + datetime.timedelta(seconds=lifetime),
        datetime.datetime(9999, 12, 31, tzinfo=datetime.UTC),
    )
    spki = public_key_der(_leaf_keys()[0].public_key())
    template = signer.ca._template
    tbs = template.tbs(serial, (not_before, not_after), spki, leaf_der.uri_names(identity.uri))
    der = template.certificate(tbs, signer.ca._signature(tbs))
    leaf = x509.load_der_x509_certificate(der)
    assert tbs == _reference_tbs(signer, leaf, identity)
    assert leaf.serial_number == serial
    assert leaf.not_valid_before_utc == not_before.replace(microsecond=0)


def test_2050_is_the_first_year_in_generalized_time() -> None:
    last = datetime.datetime(2049, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)
    first = datetime.datetime(2050, 1, 1, tzinfo=datetime.UTC)
    assert leaf_der.time(last) == b"\x17\x0d" + b"491231235959Z"
    assert leaf_der.time(first) == b"\x18\x0f" + b"20500101000000Z"


@pytest.mark.parametrize(
    ("size", "header"),
    [
        (0, "3000"),
        (127, "307f"),
        (128, "308180"),
        (255, "3081ff"),
        (256, "30820100"),
        (65536, "3083010000"),
    ],
)
def test_lengths_take_the_short_form_below_128_and_the_fewest_octets_above(
    size: int, header: str
) -> None:
    encoded = leaf_der.tlv(leaf_der.SEQUENCE, b"\x00" * size)
    assert encoded.hex().startswith(header)
    assert len(encoded) == len(header) // 2 + size
    assert leaf_der.elements(leaf_der.tlv(leaf_der.SEQUENCE, encoded)) == [encoded]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_reading_any_bytes_back_returns_or_raises_value_error(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        leaf_der.certified_key(data)
    with contextlib.suppress(ValueError):
        leaf_der.elements(data)


def test_a_truncated_leaf_is_refused_not_misread() -> None:
    signer = _signers()["pilot's self-signed root"]
    spki = public_key_der(_leaf_keys()[0].public_key())
    issued = signer.ca.issue_workload(spki, Identity("cluster.local", "shop", "cart"), DAY)
    assert leaf_der.certified_key(issued.der) == spki
    for cut in (1, 2, len(issued.der) // 2, len(issued.der) - 1):
        with pytest.raises(ValueError):
            leaf_der.certified_key(issued.der[:cut])
