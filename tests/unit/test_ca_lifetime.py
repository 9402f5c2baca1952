"""Certificate lifetimes and CSR checks of `CertificateAuthority`, called directly.

`lifetime`: 0 means the default (24h), up to the maximum (90 days) as asked,
negative or above the maximum (however far: validity_duration is an int64) a
`CsrError` saying so; lifetime settings and SECRET_TTL out of bounds are refused
at start. `sign`: NotBefore two
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
from pilot.security.certs import KeyType
from pilot.security.identity import Identity
from pilot.security.settings import SecuritySettingsError, sds_from_env
from tests.support.ca import load_chain, make_csr, utcnow, write_plugged_in

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


INT64_MAX = 2**63 - 1


@pytest.mark.parametrize(
    "seconds", [INT64_MAX, 2**63, 10**30, 999_999_999_999, int(datetime.timedelta.max.days) * 86400]
)
def test_a_huge_lifetime_is_refused_not_overflowed(ca: CertificateAuthority, seconds: int) -> None:
    """validity_duration is an int64: whatever a caller sends is an answer, not OverflowError."""
    with pytest.raises(CsrError) as caught:
        ca.lifetime(seconds)
    assert str(caught.value) == f"validity_duration {seconds}s exceeds the maximum 7776000s"


@pytest.mark.parametrize("seconds", [-1, -(2**63)])
def test_any_negative_lifetime_is_refused(ca: CertificateAuthority, seconds: int) -> None:
    with pytest.raises(CsrError) as caught:
        ca.lifetime(seconds)
    assert f"validity_duration {seconds}s is negative" in str(caught.value)
    assert "0 asks for the default" in str(caught.value)


@pytest.mark.parametrize(
    ("default", "maximum"),
    [
        (datetime.timedelta(0), datetime.timedelta(hours=1)),
        (datetime.timedelta(hours=-1), datetime.timedelta(hours=1)),
        (datetime.timedelta(hours=2), datetime.timedelta(hours=1)),
    ],
)
def test_inconsistent_lifetime_settings_are_refused(
    default: datetime.timedelta, maximum: datetime.timedelta
) -> None:
    with pytest.raises(CaSetupError, match="default certificate lifetime"):
        CaSettings(default_ttl=default, max_ttl=maximum)


@pytest.mark.parametrize("trust_domain", ["", "Cluster.Local", "evil/td", "td_1", "a..b"])
def test_invalid_trust_domain_is_a_setup_error(trust_domain: str) -> None:
    with pytest.raises(CaSetupError, match=r"^--trust-domain: trust domain .* is not a valid DNS"):
        CaSettings(trust_domain=trust_domain)


# ------------------------------------------------------------------ SECRET_TTL


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("24h", 86400),
        ("1s", 1),
        ("1m30s", 90),
        ("2160h", 90 * 86400),
        ("1.5s", 1.5),
        ("30d", 30 * 86400),  # days, as the README speaks of them
        ("90d", 90 * 86400),
    ],
)
def test_secret_ttl_within_bounds(value: str, expected: float) -> None:
    sds = sds_from_env({"SECRET_TTL": value}, KeyType.EC)
    assert sds.ttl == datetime.timedelta(seconds=expected)
    assert sds_from_env({}, KeyType.EC).ttl == DAY


@pytest.mark.parametrize(
    "value",
    [
        "0",
        "0s",
        "500ms",
        "999ms",
        "2160h1s",
        "100000h",
        "99999999999999999999999h",
        "100d",
        "90d1s",
    ],
)
def test_secret_ttl_out_of_range_is_refused(value: str) -> None:
    """Below a second the CA would be asked for 0s (its default); above 90 days it refuses."""
    with pytest.raises(SecuritySettingsError) as caught:
        sds_from_env({"SECRET_TTL": value}, KeyType.EC)
    assert str(caught.value) == (
        f"SECRET_TTL={value} is out of range: from 1s to 2160h (90 days, the most a CA signs for)"
    )


@pytest.mark.parametrize("value", ["", "-1h", "1w", "forever", "1e9s"])
def test_secret_ttl_that_is_no_duration_is_refused(value: str) -> None:
    with pytest.raises(SecuritySettingsError, match=r"^SECRET_TTL: "):
        sds_from_env({"SECRET_TTL": value}, KeyType.EC)


@pytest.mark.parametrize("value", ["0", "1", "-0.5", "nan", "inf", "1e308", "half"])
def test_grace_period_ratio_out_of_range_is_refused(value: str) -> None:
    with pytest.raises(SecuritySettingsError, match=r"^SECRET_GRACE_PERIOD_RATIO"):
        sds_from_env({"SECRET_GRACE_PERIOD_RATIO": value}, KeyType.EC)


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
