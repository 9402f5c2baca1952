"""`pilot agent`'s defaults and its socket directory, without starting anything.

By default the agent dials pilot's TLS port through the Service in deploy/ and verifies
it with Istio's root path; plaintext only with CA_INSECURE=true, and a root is needed
either way. The socket's directory is made 0700 whatever the umask; in one that group or
others can write (a kubelet's emptyDir) the socket goes into a private directory of its
own inside; one of another user, a shared `agent` directory, or a file in the socket's
place is refused. `pilot agent proxy` defaults to Istio's absolute paths.
"""

from __future__ import annotations

import os
import socket as sockets
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pilot.agent import sds_socket
from pilot.agent.envoy import SIDECAR_CONFIG_PATH, find_envoy
from pilot.agent.sds_agent import (
    DEFAULT_DISCOVERY_ADDRESS,
    DEFAULT_ROOT_CERT,
    DEFAULT_SOCKET,
    SIDECAR_ROOT_CERT,
    SIDECAR_SOCKET,
    agent_settings,
)
from pilot.cli import build_parser
from pilot.security.certs import KeyType, cert_pem, self_signed_root
from pilot.security.settings import SecuritySettingsError

IDENTITY_ENV = {"POD_NAMESPACE": "shop", "SERVICE_ACCOUNT": "cart"}


@pytest.fixture
def in_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder: the default root path is relative to it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def no_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def _write_root(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cert_pem(self_signed_root("cluster.local")[1]))


def test_the_default_is_tls_to_pilots_tls_port_verified_with_istios_root_path(
    in_folder: Path,
) -> None:
    args = build_parser().parse_args(["agent"])
    assert args.discovery_address == DEFAULT_DISCOVERY_ADDRESS == "pilot.pilot-system.svc:15012"
    _write_root(in_folder / "var/run/secrets/istio/root-cert.pem")
    assert args.sds_socket is None, "the step decides: relative here, absolute with `proxy`"
    settings = agent_settings(
        DEFAULT_SOCKET, args.discovery_address, "cluster.local", KeyType.EC, IDENTITY_ENV
    )
    assert settings.socket == Path("var/run/secrets/workload-spiffe-uds/socket")
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


# --------------------------------------------------------------------------- the socket


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("no_umask")
def test_the_socket_directory_is_made_private_whatever_the_umask(tmp_path: Path) -> None:
    socket = tmp_path / "var/run/secrets/workload-spiffe-uds/socket"
    sds_socket.prepare(socket)
    assert _mode(socket.parent) == 0o700
    assert [_mode(tmp_path / p) for p in ("var", "var/run", "var/run/secrets")] == [0o755] * 3


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755, 0o1700])
def test_an_existing_directory_only_this_user_can_write_is_used(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "sds"
    directory.mkdir()
    directory.chmod(mode)
    sds_socket.prepare(directory / "socket")
    assert _mode(directory) == mode, "an accepted directory is left as it was"


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o2777, 0o770, 0o703])
@pytest.mark.usefixtures("no_umask")
def test_in_a_directory_others_can_write_the_socket_gets_a_private_one_inside(
    tmp_path: Path, mode: int
) -> None:
    """An emptyDir as a kubelet makes it (0777, 2777 with an fsGroup), or any shared one."""
    directory = tmp_path / "workload-spiffe-uds"
    directory.mkdir()
    directory.chmod(mode)
    socket = sds_socket.resolve(directory / "socket")
    assert socket == directory / "agent" / "socket"
    sds_socket.prepare(socket)
    assert _mode(socket.parent) == 0o700
    assert _mode(directory) == mode, "the shared directory is left as it was"
    assert sds_socket.resolve(directory / "socket") == socket, "the same place on a restart"
    sds_socket.prepare(socket)  # a restarted container finds its own directory: accepted


@pytest.mark.parametrize("mode", [0o700, 0o755])
def test_a_private_directory_keeps_the_socket_where_it_was_asked(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "sds"
    directory.mkdir()
    directory.chmod(mode)
    assert sds_socket.resolve(directory / "socket") == directory / "socket"
    missing = tmp_path / "missing" / "socket"
    assert sds_socket.resolve(missing) == missing, "made private by prepare"


@pytest.mark.parametrize(
    ("mode", "writers"),
    [
        (0o777, "group and others"),
        (0o1777, "group and others"),
        (0o770, "group"),
        (0o703, "others"),
    ],
)
def test_an_agent_directory_others_can_write_is_refused(
    tmp_path: Path, mode: int, writers: str
) -> None:
    """Someone made `agent` in the shared volume first: it is not the agent's to serve from."""
    directory = tmp_path / "sds"
    directory.mkdir(mode=0o777)
    directory.chmod(0o777)
    (directory / "agent").mkdir()
    (directory / "agent").chmod(mode)
    socket = sds_socket.resolve(directory / "socket")
    with pytest.raises(sds_socket.SocketPathError) as caught:
        sds_socket.prepare(socket)
    assert str(caught.value).startswith(
        f"SDS socket directory {directory / 'agent'} is writable by {writers} (mode {mode:04o})"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "sds"
    directory.mkdir(mode=0o700)
    os.chown(directory, 4242, 4242)
    with pytest.raises(sds_socket.SocketPathError, match="belongs to uid 4242"):
        sds_socket.prepare(directory / "socket")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "agent").mkdir(mode=0o700)
    os.chown(shared / "agent", 4242, 4242)
    with pytest.raises(sds_socket.SocketPathError, match="agent belongs to uid 4242"):
        sds_socket.prepare(sds_socket.resolve(shared / "socket"))


def test_a_stale_socket_is_removed_any_other_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "socket"
    with sockets.socket(sockets.AF_UNIX) as stale:
        stale.bind(str(path))
    sds_socket.prepare(path)
    assert not path.exists()
    path.write_text("someone's file")
    with pytest.raises(sds_socket.SocketPathError, match="exists and is not a socket"):
        sds_socket.prepare(path)
    assert path.read_text() == "someone's file"


# --------------------------------------------------------------------------- `proxy`


def test_proxy_defaults_to_istios_absolute_paths_and_envoy_on_path(tmp_path: Path) -> None:
    """What the injected istio-proxy container runs: no path relative to its working directory."""
    assert Path("/var/run/secrets/workload-spiffe-uds/socket") == SIDECAR_SOCKET
    assert Path("/etc/istio/proxy") == SIDECAR_CONFIG_PATH
    assert Path("/var/run/secrets/istio/root-cert.pem") == SIDECAR_ROOT_CERT
    envoy = tmp_path / "bin" / "envoy"
    envoy.parent.mkdir()
    envoy.write_text("#!/bin/sh\n")
    envoy.chmod(0o755)
    assert find_envoy(None, f"/nonexistent:{envoy.parent}") == envoy
    assert find_envoy(Path("/opt/envoy"), str(envoy.parent)) == Path("/opt/envoy")
    args = build_parser().parse_args(["agent", "proxy"])
    assert (args.agent_step, args.kind, args.sds_socket, args.config_path) == (
        "proxy",
        "sidecar",
        None,
        None,
    )
