"""`pilot agent`'s defaults and its socket directory, without starting anything.

By default the agent dials pilot's TLS port through the Service in deploy/ and verifies
it with Istio's root path; plaintext only with CA_INSECURE=true, and a root is needed
either way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pilot.agent import DEFAULT_DISCOVERY_ADDRESS, DEFAULT_ROOT_CERT, agent_settings
from pilot.cli import _parser
from pilot.security.certs import KeyType, cert_pem, self_signed_root
from pilot.security.settings import SecuritySettingsError

IDENTITY_ENV = {"POD_NAMESPACE": "shop", "SERVICE_ACCOUNT": "cart"}


@pytest.fixture
def in_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder: the default root path is relative to it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write_root(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cert_pem(self_signed_root("cluster.local")[1]))


def test_the_default_is_tls_to_pilots_tls_port_verified_with_istios_root_path(
    in_folder: Path,
) -> None:
    args = _parser().parse_args(["agent"])
    assert args.discovery_address == DEFAULT_DISCOVERY_ADDRESS == "pilot.pilot-system.svc:15012"
    _write_root(in_folder / "var/run/secrets/istio/root-cert.pem")
    settings = agent_settings(
        args.sds_socket, args.discovery_address, "cluster.local", KeyType.EC, IDENTITY_ENV
    )
    remote = settings.remote_ca
    assert remote.address == "pilot.pilot-system.svc:15012"
    assert not remote.insecure
    assert remote.root_cert == DEFAULT_ROOT_CERT == Path("./var/run/secrets/istio/root-cert.pem")


def test_ca_addr_and_ca_root_cert_override_the_defaults(in_folder: Path) -> None:
    _write_root(in_folder / "mine.pem")
    env = IDENTITY_ENV | {"CA_ADDR": "ca.example:443", "CA_ROOT_CERT": "mine.pem"}
    remote = agent_settings(Path("s"), "pilot:15012", "cluster.local", KeyType.EC, env).remote_ca
    assert (remote.address, remote.root_cert, remote.insecure) == (
        "ca.example:443",
        Path("mine.pem"),
        False,
    )


@pytest.mark.parametrize("value", ["", "false", "0", "no"])
def test_plaintext_only_when_ca_insecure_says_so(in_folder: Path, value: str) -> None:
    _write_root(in_folder / DEFAULT_ROOT_CERT)
    env = IDENTITY_ENV | {"CA_INSECURE": value}
    assert not agent_settings(Path("s"), "p:1", "td", KeyType.EC, env).remote_ca.insecure
    env = IDENTITY_ENV | {"CA_INSECURE": "true"}
    assert agent_settings(Path("s"), "p:1", "td", KeyType.EC, env).remote_ca.insecure


@pytest.mark.parametrize("insecure", ["", "true"])
def test_a_missing_root_names_the_variable_and_the_path(in_folder: Path, insecure: str) -> None:
    env = IDENTITY_ENV | {"CA_INSECURE": insecure}
    with pytest.raises(SecuritySettingsError) as caught:
        agent_settings(Path("s"), "p:1", "td", KeyType.EC, env)
    message = str(caught.value)
    assert message.startswith("CA_ROOT_CERT: cannot read the CA root ")
    assert str(in_folder / "var/run/secrets/istio/root-cert.pem") in message
    assert "\n" not in message


def test_a_root_file_without_a_certificate_is_refused(in_folder: Path) -> None:
    (in_folder / "root.pem").write_text("not a certificate\n")
    env = IDENTITY_ENV | {"CA_ROOT_CERT": "root.pem"}
    with pytest.raises(SecuritySettingsError, match=r"no PEM certificate in .*/root\.pem"):
        agent_settings(Path("s"), "p:1", "td", KeyType.EC, env)
