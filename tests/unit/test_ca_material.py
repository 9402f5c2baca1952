"""What pilot's CA accepts as its key material, called directly (`CertificateAuthority`).

For each source of a CA (the self-signed root kept in `--ca-state-dir`, Istio's
plugged-in layout in `--ca-cert-dir`, the shared Secret as PEM):

- the key must be the certificate's, and every certificate up to the root a CA
  certificate (BasicConstraints CA:TRUE, keyCertSign where KeyUsage is given,
  path lengths respected) that is valid now: else `CaSetupError` naming the file;
- files that are not PEM are a `CaSetupError`, never a traceback;
- the state directory and its key file are refused when others can read them
  (the plugged-in `ca-key.pem` too, but its own group may read it: Kubernetes
  gives Secret volumes to the pod's fsGroup); what pilot writes is 0700/0600
  whatever the umask.
"""

from __future__ import annotations

import datetime
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pilot.security.ca import CaSettings, CaSetupError, CertificateAuthority
from pilot.security.root_store import SECRET_NAME
from tests.support.ca import (
    Issuer,
    new_ca,
    utcnow,
    write_plugged_in,
    write_state_dir,
)

HOUR = datetime.timedelta(hours=1)
DAY = datetime.timedelta(days=1)
SECRET = f"Secret default/{SECRET_NAME}"


def _usage(*, key_cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _load_state(directory: Path) -> CertificateAuthority:
    return CertificateAuthority.load(CaSettings(state_dir=directory))


def _load_plugged(directory: Path) -> CertificateAuthority:
    return CertificateAuthority.load(CaSettings(cert_dir=directory))


def _from_secret(root: Issuer, key: bytes | None = None) -> CertificateAuthority:
    return CertificateAuthority.from_pem(
        root.key_pem if key is None else key, root.cert_pem.encode(), CaSettings(), SECRET
    )


def _setup_error(load: object, *args: object) -> str:
    with pytest.raises(CaSetupError) as caught:
        load(*args)  # type: ignore[operator]
    return str(caught.value)


# ------------------------------------------------------------------ the key is the certificate's


def test_state_dir_key_not_matching_its_root_is_refused(tmp_path: Path) -> None:
    state = write_state_dir(tmp_path / "ca", new_ca("kept root"))
    (state / "root-key.pem").write_bytes(new_ca("another").key_pem)
    message = _setup_error(_load_state, state)
    assert message == f"{state / 'root-key.pem'} is not the key of {state / 'root-cert.pem'}"


def test_plugged_in_key_not_matching_is_refused(tmp_path: Path) -> None:
    plugged = write_plugged_in(tmp_path / "cacerts")
    (plugged.directory / "ca-key.pem").write_bytes(new_ca("another").key_pem)
    message = _setup_error(_load_plugged, plugged.directory)
    assert message == (
        f"{plugged.directory / 'ca-key.pem'} is not the key of {plugged.directory / 'ca-cert.pem'}"
    )


def test_secret_key_not_matching_is_refused() -> None:
    message = _setup_error(_from_secret, new_ca("shared"), new_ca("another").key_pem)
    assert message == f"{SECRET} ca-key.pem is not the key of {SECRET} ca-cert.pem"


# ------------------------------------------------------------------ the certificate is a CA


NOT_A_CA = {
    "ca-false": {"is_ca": False},
    "no-keycertsign": {"usage": _usage(key_cert_sign=False)},
}


@pytest.mark.parametrize("fault", NOT_A_CA, ids=list(NOT_A_CA))
def test_state_dir_root_that_is_not_a_ca_is_refused(tmp_path: Path, fault: str) -> None:
    state = write_state_dir(tmp_path / "ca", new_ca("a leaf really", **NOT_A_CA[fault]))  # type: ignore[arg-type]
    message = _setup_error(_load_state, state)
    assert message.startswith(str(state / "root-cert.pem"))
    assert ("not a CA certificate" if fault == "ca-false" else "lacks keyCertSign") in message


@pytest.mark.parametrize("fault", NOT_A_CA, ids=list(NOT_A_CA))
def test_plugged_in_signing_certificate_that_is_not_a_ca_is_refused(
    tmp_path: Path, fault: str
) -> None:
    root = new_ca("plugged-in root")
    leaf = new_ca("a leaf really", root, **NOT_A_CA[fault])  # type: ignore[arg-type]
    plugged = write_plugged_in(tmp_path / "cacerts", root=root, intermediate=leaf)
    message = _setup_error(_load_plugged, plugged.directory)
    assert message.startswith(str(plugged.directory / "ca-cert.pem"))
    assert ("not a CA certificate" if fault == "ca-false" else "lacks keyCertSign") in message


def test_plugged_in_root_that_is_not_a_ca_is_refused(tmp_path: Path) -> None:
    root = new_ca("plugged-in root", is_ca=False)
    plugged = write_plugged_in(tmp_path / "cacerts", root=root)
    message = _setup_error(_load_plugged, plugged.directory)
    assert message.startswith(f"{plugged.directory / 'root-cert.pem'} is not a CA certificate")


@pytest.mark.parametrize("fault", NOT_A_CA, ids=list(NOT_A_CA))
def test_secret_certificate_that_is_not_a_ca_is_refused(fault: str) -> None:
    message = _setup_error(_from_secret, new_ca("shared", **NOT_A_CA[fault]))  # type: ignore[arg-type]
    assert message.startswith(f"{SECRET} ca-cert.pem")


def test_ca_without_key_usage_is_accepted(tmp_path: Path) -> None:
    """No KeyUsage means any use (RFC 5280), as `openssl req -x509` makes roots by default."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "openssl-style root")])
    now = utcnow()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - HOUR)
        .not_valid_after(now + DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    ca = _from_secret(Issuer(key, cert))
    assert ca.root == cert


def test_path_length_of_the_root_must_allow_the_intermediate(tmp_path: Path) -> None:
    root = new_ca("root for leaves only", path_length=0)
    plugged = write_plugged_in(tmp_path / "cacerts", root=root)
    message = _setup_error(_load_plugged, plugged.directory)
    assert message == (
        f"{plugged.directory / 'root-cert.pem'} allows 0 CA certificates below it"
        " (BasicConstraints pathlen) but the chain has 1"
    )


def test_path_lengths_that_fit_are_accepted(tmp_path: Path) -> None:
    root = new_ca("root", path_length=1)
    intermediate = new_ca("intermediate", root, path_length=0)
    plugged = write_plugged_in(tmp_path / "cacerts", root=root, intermediate=intermediate)
    assert _load_plugged(plugged.directory).signing_cert == intermediate.cert


# ------------------------------------------------------------------ not PEM


@pytest.mark.parametrize("name", ["root-cert.pem", "root-key.pem"])
def test_state_dir_file_that_is_not_pem_is_a_setup_error(tmp_path: Path, name: str) -> None:
    state = write_state_dir(tmp_path / "ca", new_ca("kept root"))
    (state / name).write_text("not PEM at all\n")
    message = _setup_error(_load_state, state)
    assert message.startswith(str(state / name))
    assert "PEM" in message


@pytest.mark.parametrize("name", ["ca-cert.pem", "ca-key.pem", "root-cert.pem", "cert-chain.pem"])
def test_plugged_in_file_that_is_not_pem_is_a_setup_error(tmp_path: Path, name: str) -> None:
    plugged = write_plugged_in(tmp_path / "cacerts")
    (plugged.directory / name).write_text("")
    message = _setup_error(_load_plugged, plugged.directory)
    assert message.startswith(str(plugged.directory / name))


def test_encrypted_key_is_a_setup_error(tmp_path: Path) -> None:
    plugged = write_plugged_in(tmp_path / "cacerts")
    encrypted = plugged.intermediate.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    (plugged.directory / "ca-key.pem").write_bytes(encrypted)
    message = _setup_error(_load_plugged, plugged.directory)
    assert message.startswith(f"{plugged.directory / 'ca-key.pem'} holds no usable PEM private key")
    assert "BEGIN" not in message


# ------------------------------------------------------------------ valid now


def _expired(name: str, parent: Issuer | None = None) -> Issuer:
    return new_ca(name, parent, valid_for=DAY, starts=utcnow() - 2 * DAY)


def _not_yet_valid(name: str, parent: Issuer | None = None) -> Issuer:
    return new_ca(name, parent, valid_for=DAY, starts=utcnow() + HOUR)


def test_expired_state_dir_root_is_refused(tmp_path: Path) -> None:
    root = _expired("kept root")
    state = write_state_dir(tmp_path / "ca", root)
    message = _setup_error(_load_state, state)
    expiry = root.cert.not_valid_after_utc.isoformat()
    assert message.startswith(f"{state / 'root-cert.pem'} expired at {expiry}")
    assert f"move {state} aside" in message, "say how to get a new root"
    assert (state / "root-key.pem").read_bytes() == root.key_pem, "and keep the old one"


def test_not_yet_valid_state_dir_root_is_refused(tmp_path: Path) -> None:
    root = _not_yet_valid("kept root")
    state = write_state_dir(tmp_path / "ca", root)
    message = _setup_error(_load_state, state)
    start = root.cert.not_valid_before_utc.isoformat()
    assert message.startswith(f"{state / 'root-cert.pem'} is not valid until {start}")


@pytest.mark.parametrize("which", ["intermediate", "root"])
def test_expired_plugged_in_certificate_is_refused(tmp_path: Path, which: str) -> None:
    if which == "root":
        root = _expired("plugged-in root")
        intermediate = new_ca("plugged-in intermediate", root)
        name = "root-cert.pem"
    else:
        root = new_ca("plugged-in root")
        intermediate = _expired("plugged-in intermediate", root)
        name = "ca-cert.pem"
    plugged = write_plugged_in(tmp_path / "cacerts", root=root, intermediate=intermediate)
    message = _setup_error(_load_plugged, plugged.directory)
    assert message.startswith(f"{plugged.directory / name} expired at ")
    assert f"put valid CA files in {plugged.directory}" in message


def test_expired_secret_root_is_refused() -> None:
    message = _setup_error(_from_secret, _expired("shared"))
    assert message.startswith(f"{SECRET} ca-cert.pem expired at ")
    assert f"delete {SECRET}" in message


# ------------------------------------------------------------------ nobody else reads the key


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o705, 0o710, 0o701])
def test_state_dir_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    state = write_state_dir(tmp_path / "ca", new_ca("kept root"))
    state.chmod(mode)
    message = _setup_error(_load_state, state)
    assert message.startswith(f"--ca-state-dir {state} is open to ")
    assert f"(mode {mode:04o})" in message
    assert f"chmod 700 {state}" in message


def test_empty_state_dir_open_to_others_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "ca"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    message = _setup_error(_load_state, state)
    assert message.startswith(f"--ca-state-dir {state} is open to its group and others")
    assert list(state.iterdir()) == [], "no root made in it"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o606])
def test_state_dir_key_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    state = write_state_dir(tmp_path / "ca", new_ca("kept root"))
    (state / "root-key.pem").chmod(mode)
    message = _setup_error(_load_state, state)
    assert message.startswith(f"{state / 'root-key.pem'} is a private key open to ")
    assert f"chmod 600 {state / 'root-key.pem'}" in message


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_state_dir_key_for_its_owner_only_is_accepted(tmp_path: Path, mode: int) -> None:
    root = new_ca("kept root")
    state = write_state_dir(tmp_path / "ca", root)
    (state / "root-key.pem").chmod(mode)
    assert _load_state(state).root == root.cert


def test_state_dir_certificate_may_be_public(tmp_path: Path) -> None:
    root = new_ca("kept root")
    state = write_state_dir(tmp_path / "ca", root)
    (state / "root-cert.pem").chmod(0o644)
    assert _load_state(state).root == root.cert


@pytest.mark.parametrize("mode", [0o604, 0o644, 0o606, 0o660, 0o670])
def test_plugged_in_key_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    plugged = write_plugged_in(tmp_path / "cacerts")
    key = plugged.directory / "ca-key.pem"
    key.chmod(mode)
    message = _setup_error(_load_plugged, plugged.directory)
    assert message.startswith(f"{key} is a private key open to ")
    assert f"(mode {mode:04o})" in message


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o640, 0o440])
def test_plugged_in_key_readable_by_pilots_own_group_is_accepted(tmp_path: Path, mode: int) -> None:
    """A Kubernetes Secret volume under an fsGroup: 0440, group = the pod's group."""
    plugged = write_plugged_in(tmp_path / "cacerts")
    (plugged.directory / "ca-key.pem").chmod(mode)
    assert (plugged.directory / "ca-key.pem").stat().st_gid == os.getegid()
    assert _load_plugged(plugged.directory).signing_cert == plugged.intermediate.cert


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another group needs root")
def test_plugged_in_key_readable_by_another_group_is_refused(tmp_path: Path) -> None:
    plugged = write_plugged_in(tmp_path / "cacerts")
    key = plugged.directory / "ca-key.pem"
    os.chown(key, -1, os.getegid() + 4242)
    key.chmod(0o640)
    message = _setup_error(_load_plugged, plugged.directory)
    assert message.startswith(f"{key} is a private key open to its group (mode 0640)")


@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077, 0o277], indirect=True)
def test_what_pilot_writes_is_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    state = tmp_path / "ca"
    ca = _load_state(state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for name in ("root-key.pem", "root-cert.pem"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
    assert _load_state(state).root == ca.root, "and pilot reads it back next time"
