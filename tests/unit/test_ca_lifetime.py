"""Certificate lifetimes and CSR checks of `CertificateAuthority`, called directly.

`lifetime`: 0 means the default (24h), up to the maximum (90 days) as asked,
negative or above the maximum a `CsrError` saying so. `sign`: NotBefore two
minutes back, NotAfter the requested lifetime from now but never past the
signing certificate's own expiry; only RSA >= 2048 and EC keys, only CSRs whose
signature verifies.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from pilot.security.ca import CaSettings, CaSetupError, CertificateAuthority, CsrError
from pilot.security.identity import Identity
from tests.integration.ca_support import load_chain, make_csr, utcnow, write_plugged_in

DAY = datetime.timedelta(days=1)
CALLER = Identity("cluster.local", "ns1", "sa1")
SECOND = datetime.timedelta(seconds=1)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority.load(CaSettings(state_dir=tmp_path_factory.mktemp("ca")))


def test_zero_means_the_default(ca: CertificateAuthority) -> None:
    assert ca.lifetime(0) == datetime.timedelta(hours=24)


@pytest.mark.parametrize("seconds", [1, 3600, 90 * 86400])
def test_requested_lifetime_up_to_the_maximum(ca: CertificateAuthority, seconds: int) -> None:
    assert ca.lifetime(seconds) == datetime.timedelta(seconds=seconds)


def test_above_the_maximum_is_refused(ca: CertificateAuthority) -> None:
    with pytest.raises(CsrError) as caught:
        ca.lifetime(90 * 86400 + 1)
    assert str(caught.value) == "validity_duration 7776001s exceeds the maximum 7776000s"


def test_negative_is_refused(ca: CertificateAuthority) -> None:
    with pytest.raises(CsrError, match="negative"):
        ca.lifetime(-5)


@pytest.mark.parametrize("trust_domain", ["", "Cluster.Local", "evil/td", "td_1", "a..b"])
def test_invalid_trust_domain_is_a_setup_error(trust_domain: str) -> None:
    with pytest.raises(CaSetupError, match=r"^--trust-domain: trust domain .* is not a valid DNS"):
        CaSettings(trust_domain=trust_domain)


def test_configured_default_and_maximum(tmp_path: Path) -> None:
    settings = CaSettings(
        state_dir=tmp_path,
        default_ttl=datetime.timedelta(hours=1),
        max_ttl=datetime.timedelta(hours=2),
    )
    ca = CertificateAuthority.load(settings)
    assert ca.lifetime(0) == datetime.timedelta(hours=1)
    assert ca.lifetime(7200) == datetime.timedelta(hours=2)
    with pytest.raises(CsrError, match="maximum 7200s"):
        ca.lifetime(7201)


@pytest.mark.parametrize("ttl", [datetime.timedelta(minutes=5), DAY, 90 * DAY])
def test_validity_window(ca: CertificateAuthority, ttl: datetime.timedelta) -> None:
    before = utcnow().replace(microsecond=0)
    leaf = load_chain(ca.sign(make_csr()[1], CALLER, ttl))[0]
    after = utcnow()
    backdate = datetime.timedelta(minutes=2)
    assert before - backdate - SECOND <= leaf.not_valid_before_utc <= after - backdate
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == ttl + backdate


def test_lifetime_is_capped_by_the_signing_certificate(tmp_path: Path) -> None:
    plugged = write_plugged_in(tmp_path, intermediate_valid_for=datetime.timedelta(hours=1))
    ca = CertificateAuthority.load(CaSettings(cert_dir=tmp_path))
    chain = load_chain(ca.sign(make_csr()[1], CALLER, DAY))
    expiry = plugged.intermediate.cert.not_valid_after_utc
    assert chain[0].not_valid_after_utc == expiry, "a leaf must not outlive its issuer"


def _csr_with(key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) -> bytes:
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(key, algorithm).public_bytes(serialization.Encoding.PEM)


def test_small_rsa_key_is_refused(ca: CertificateAuthority) -> None:
    csr = _csr_with(rsa.generate_private_key(public_exponent=65537, key_size=1024))
    with pytest.raises(CsrError, match="RSA key of 1024 bits is too small"):
        ca.sign(csr, CALLER, DAY)


def test_rsa_2048_is_signed(ca: CertificateAuthority) -> None:
    csr = _csr_with(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    assert len(ca.sign(csr, CALLER, DAY)) == 2


def test_unsupported_key_type_is_refused(ca: CertificateAuthority) -> None:
    with pytest.raises(CsrError, match="unsupported key type"):
        ca.sign(_csr_with(ed25519.Ed25519PrivateKey.generate()), CALLER, DAY)


def test_identity_is_the_one_told_not_the_csrs(ca: CertificateAuthority) -> None:
    _, csr = make_csr(["spiffe://cluster.local/ns/kube-system/sa/admin"])
    leaf = load_chain(ca.sign(csr, CALLER, DAY))[0]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [CALLER.uri]
