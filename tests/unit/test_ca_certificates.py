"""The certificates pilot's CA makes, and when it makes none, called directly.

- The self-signed root is a CA for leaves only: BasicConstraints CA:TRUE, pathlen 0.
- Every leaf carries a SubjectKeyIdentifier (of its own key) and an
  AuthorityKeyIdentifier equal to its issuer's SubjectKeyIdentifier, so that
  verifiers find the issuer by key id, whatever way the issuer computed it.
- A leaf never outlives the certificates above it: a longer lifetime is cut
  short to the CA's expiry (logged once); once the CA has expired (or before it
  is valid) it signs nothing and says so (`CaExpired`), and pilot's SDS sees
  that as a CA error it retries (`CaError`), not a certificate.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pilot.security import ca as ca_module
from pilot.security.ca import CaExpired, CaSettings, CertificateAuthority
from pilot.security.ca_client import CaError, LocalCa
from pilot.security.certs import self_signed_root
from pilot.security.identity import Identity
from tests.support.ca import (
    Issuer,
    load_chain,
    make_csr,
    new_ca,
    utcnow,
    write_plugged_in,
)

CALLER = Identity("cluster.local", "ns1", "sa1")
HOUR = datetime.timedelta(hours=1)
DAY = datetime.timedelta(days=1)


def _ski(certificate: x509.Certificate) -> bytes:
    return certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest


def _aki(certificate: x509.Certificate) -> bytes | None:
    extension = certificate.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
    return extension.value.key_identifier


def _ca_of(issuer: Issuer) -> CertificateAuthority:
    """A CA signing with `issuer` as its own root, built without the start-up checks."""
    return CertificateAuthority(issuer.key, issuer.cert, [issuer.cert], issuer.cert, CaSettings())


def _sign(ca: CertificateAuthority, ttl: datetime.timedelta = DAY) -> x509.Certificate:
    return load_chain(ca.sign(make_csr()[1], CALLER, ttl))[0]


# ------------------------------------------------------------------ extensions


def test_self_signed_root_is_a_ca_for_leaves_only() -> None:
    _, root = self_signed_root("cluster.local")
    constraints = root.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0
    usage = root.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign


def test_leaf_names_its_key_and_its_issuers(tmp_path: Path) -> None:
    ca = CertificateAuthority.load(CaSettings(state_dir=tmp_path / "ca"))
    key, csr = make_csr()
    leaf = load_chain(ca.sign(csr, CALLER, DAY))[0]
    assert _ski(leaf) == x509.SubjectKeyIdentifier.from_public_key(key.public_key()).digest
    assert _aki(leaf) == _ski(ca.root)


def test_server_certificate_names_its_key_and_its_issuers(tmp_path: Path) -> None:
    ca = CertificateAuthority.load(CaSettings(state_dir=tmp_path / "ca"))
    key_pem, chain = ca.issue_server(["pilot"], DAY)
    leaf = load_chain(chain)[0]
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert _ski(leaf) == x509.SubjectKeyIdentifier.from_public_key(key.public_key()).digest  # type: ignore[arg-type]
    assert _aki(leaf) == _ski(ca.root)


def test_leaf_under_a_plugged_in_intermediate_names_the_intermediates_key_id(
    tmp_path: Path,
) -> None:
    """The AKI is the issuer's own SKI, even one not computed the usual way."""
    root = new_ca("plugged-in root")
    odd_ski = x509.SubjectKeyIdentifier(b"\x01" * 8)
    key = ec.generate_private_key(ec.SECP256R1())
    now = utcnow()
    intermediate = Issuer(
        key,
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "odd SKI")]))
        .issuer_name(root.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - HOUR)
        .not_valid_after(now + DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(odd_ski, critical=False)
        .sign(root.key, hashes.SHA256()),
    )
    plugged = write_plugged_in(tmp_path / "cacerts", root=root, intermediate=intermediate)
    leaf = _sign(CertificateAuthority.load(CaSettings(cert_dir=plugged.directory)))
    assert _aki(leaf) == b"\x01" * 8


def test_issuer_without_a_key_id_is_named_by_its_key_hash() -> None:
    issuer = new_ca("no SKI", subject_key_id=False)
    leaf = _sign(_ca_of(issuer))
    expected = x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key())
    assert _aki(leaf) == expected.key_identifier


# ------------------------------------------------------------------ never past the CA's expiry


def test_lifetime_is_cut_to_the_cas_expiry_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    issuer = new_ca("expiring soon", valid_for=HOUR)
    ca = _ca_of(issuer)
    with caplog.at_level(logging.WARNING, logger="pilot.security.ca"):
        leaves = [_sign(ca, DAY) for _ in range(3)]
    for leaf in leaves:
        assert leaf.not_valid_after_utc == issuer.cert.not_valid_after_utc
        assert leaf.not_valid_before_utc < leaf.not_valid_after_utc
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert issuer.cert.not_valid_after_utc.isoformat() in warnings[0]


def test_lifetime_within_the_cas_is_not_cut(caplog: pytest.LogCaptureFixture) -> None:
    ca = _ca_of(new_ca("long-lived", valid_for=30 * DAY))
    with caplog.at_level(logging.WARNING, logger="pilot.security.ca"):
        leaf = _sign(ca, HOUR)
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == HOUR + ca_module.BACKDATE
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_leaf_ends_with_the_root_when_the_root_expires_first(tmp_path: Path) -> None:
    root = new_ca("root expiring first", valid_for=2 * HOUR)
    intermediate = new_ca("intermediate", root, valid_for=30 * DAY)
    plugged = write_plugged_in(tmp_path / "cacerts", root=root, intermediate=intermediate)
    leaf = _sign(CertificateAuthority.load(CaSettings(cert_dir=plugged.directory)), DAY)
    assert leaf.not_valid_after_utc == root.cert.not_valid_after_utc


def test_leaf_does_not_begin_before_its_ca() -> None:
    """Backdated two minutes, but not to before a CA made a moment ago."""
    issuer = new_ca("brand new", starts=utcnow().replace(microsecond=0), valid_for=DAY)
    leaf = _sign(_ca_of(issuer), HOUR)
    assert leaf.not_valid_before_utc == issuer.cert.not_valid_before_utc


# ------------------------------------------------------------------ an expired CA signs nothing


def test_expired_ca_signs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    issuer = new_ca("expires in an hour", valid_for=HOUR)
    ca = _ca_of(issuer)
    _sign(ca)  # valid now
    later = utcnow() + 2 * HOUR
    monkeypatch.setattr(ca_module, "utcnow", lambda: later)
    with pytest.raises(CaExpired) as caught:
        _sign(ca)
    assert str(caught.value) == (
        f"the CA's certificate expired at {issuer.cert.not_valid_after_utc.isoformat()}:"
        " it signs nothing until it is replaced"
    )
    with pytest.raises(CaExpired):
        ca.issue_server(["pilot"], DAY)


def test_ca_not_yet_valid_signs_nothing() -> None:
    issuer = new_ca("from tomorrow", starts=utcnow() + DAY, valid_for=DAY)
    with pytest.raises(CaExpired, match="is not valid until"):
        _sign(_ca_of(issuer))


async def test_sds_sees_an_expired_ca_as_a_ca_error(monkeypatch: pytest.MonkeyPatch) -> None:
    ca = _ca_of(new_ca("expires in an hour", valid_for=HOUR))
    later = utcnow() + 2 * HOUR
    monkeypatch.setattr(ca_module, "utcnow", lambda: later)
    with pytest.raises(CaError, match=r"^pilot's CA: the CA's certificate expired at "):
        await LocalCa(ca, asyncio.Semaphore(1)).sign(make_csr()[1], CALLER, DAY)
