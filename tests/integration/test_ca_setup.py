"""Where pilot's CA gets its key: a self-signed root kept in `--ca-state-dir`, or `--ca-cert-dir`.

- Without `--ca-cert-dir`, the first pilot makes a root and keeps it in the state
  directory (0700, files 0600); the next pilot on the same directory uses the same
  root, so certificates from before a restart still verify.
- With `--ca-cert-dir` in Istio's plugged-in layout (a root and an intermediate
  made here), certificates chain leaf -> intermediate -> that root, over the CA
  API and over SDS alike.
- A missing or inconsistent file is a `CaSetupError` naming it, and
  `pilot discovery` exits 2 with that message.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import stat
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from pilot.security.ca import PLUGGED_IN_FILES, CaSettings, CaSetupError, CertificateAuthority
from pilot.security.identity import Identity
from pilot.xds import types
from tests.support.ca import (
    CaCaller,
    assert_issued_chain,
    kube_api,
    load_chain,
    make_csr,
    new_ca,
    node,
    public_der,
    sa_token,
    san_uris,
    spiffe,
    write_plugged_in,
)
from tests.support.deadline import bounded
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pilot import running_pilot
from tests.support.sds_secrets import ROOT, WORKLOAD, root_in, workload_in
from tests.support.xds_client import XdsClient

HOUR = datetime.timedelta(hours=1)
MESH = simple_mesh({"a": ["10.0.0.1"]})
CALLER = ("ns1", "sa1")
WAIT = 10.0


def _verdict(child: x509.Certificate, parent: x509.Certificate) -> str:
    try:
        child.verify_directly_issued_by(parent)
    except (ValueError, TypeError, InvalidSignature):
        return "does not verify"
    return "verifies"


def _root_in(state_dir: Path) -> x509.Certificate:
    return load_chain((state_dir / "root-cert.pem").read_text())[0]


# ------------------------------------------------------------------ self-signed root


async def test_self_signed_root_is_kept_in_the_state_dir(tmp_path: Path) -> None:
    state_dir = tmp_path / "ca"
    assert not state_dir.exists()
    async with running_pilot(tmp_path, MESH) as pilot:
        assert pilot.discovery.security is not None
        served_root = pilot.discovery.security.ca.root
    key_file, cert_file = state_dir / "root-key.pem", state_dir / "root-cert.pem"
    assert cert_file.is_file() and key_file.is_file()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(state_dir.stat().st_mode) & 0o077 == 0, "state dir open to others"
    assert sorted(p.name for p in state_dir.iterdir()) == ["root-cert.pem", "root-key.pem"]
    root = _root_in(state_dir)
    assert root == served_root
    root.verify_directly_issued_by(root)  # self-signed
    assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    matches = public_der(key) == public_der(root.public_key())
    assert matches, "root-key.pem is not the key of root-cert.pem"


async def test_restart_keeps_the_same_root(tmp_path: Path) -> None:
    async with kube_api(tmp_path) as (srv, kubeconfig):
        token = sa_token(srv, *CALLER)
        async with running_pilot(tmp_path, MESH, kubeconfig=kubeconfig) as first:
            assert first.discovery.security is not None
            first_root = first.discovery.security.ca.root
            async with CaCaller(first.grpc_target) as caller:
                before = load_chain(await caller.create(make_csr()[1], token=token))
        key_bytes = (tmp_path / "ca" / "root-key.pem").read_bytes()

        async with running_pilot(tmp_path, MESH, kubeconfig=kubeconfig) as second:
            assert second.discovery.security is not None
            assert second.discovery.security.ca.root == first_root
            async with CaCaller(second.grpc_target) as caller:
                after = load_chain(await caller.create(make_csr()[1], token=token))
            async with XdsClient(second.grpc_target) as xds:
                ads = xds.ads(node("proxy-1", *CALLER))
                await ads.subscribe(types.SECRET, [ROOT])
                rootca = root_in(await ads.ack_until(types.SECRET, [ROOT], WAIT))

    unchanged = (tmp_path / "ca" / "root-key.pem").read_bytes() == key_bytes
    assert unchanged, "the restarted pilot rewrote root-key.pem"
    assert_issued_chain(before, first_root)
    assert_issued_chain(after, first_root)
    assert load_chain(rootca) == [first_root]


# ------------------------------------------------------------------ plugged-in CA


@pytest.mark.parametrize("chain_has_root", [True, False], ids=["chain-with-root", "chain-no-root"])
async def test_plugged_in_ca_signs_under_its_root_via_the_intermediate(
    tmp_path: Path, chain_has_root: bool
) -> None:
    plugged = write_plugged_in(tmp_path / "cacerts", chain_has_root=chain_has_root)
    state_dir = tmp_path / "state"
    ca = CaSettings(cert_dir=plugged.directory, state_dir=state_dir)
    async with kube_api(tmp_path) as (srv, kubeconfig):
        token = sa_token(srv, *CALLER)
        async with running_pilot(
            tmp_path, MESH, security={"ca": ca}, kubeconfig=kubeconfig
        ) as pilot:
            async with CaCaller(pilot.grpc_target) as caller:
                chain = load_chain(await caller.create(make_csr()[1], token=token))
            async with XdsClient(pilot.grpc_target) as xds:
                ads = xds.ads(node("proxy-1", "ns2", "sa2"))
                await ads.subscribe(types.SECRET, [WORKLOAD, ROOT])
                secrets = await ads.ack_until(types.SECRET, [WORKLOAD, ROOT], WAIT)

    assert chain[1:] == [plugged.intermediate.cert, plugged.root.cert]
    assert_issued_chain(chain, plugged.root.cert)
    assert chain[0].issuer == plugged.intermediate.cert.subject
    assert san_uris(chain[0]) == [spiffe(*CALLER)]

    sds_chain = list(workload_in(secrets).chain)
    assert sds_chain[1:] == [plugged.intermediate.cert, plugged.root.cert]
    assert_issued_chain(sds_chain, plugged.root.cert)
    assert san_uris(sds_chain[0]) == [spiffe("ns2", "sa2")]
    assert load_chain(root_in(secrets)) == [plugged.root.cert]
    assert not state_dir.exists(), "with --ca-cert-dir, no self-signed root is made"


@pytest.mark.parametrize("missing", PLUGGED_IN_FILES)
def test_missing_plugged_in_file_is_a_setup_error(tmp_path: Path, missing: str) -> None:
    plugged = write_plugged_in(tmp_path / "cacerts")
    (plugged.directory / missing).unlink()
    with pytest.raises(CaSetupError) as caught:
        CertificateAuthority.load(CaSettings(cert_dir=plugged.directory))
    message = str(caught.value)
    assert missing in message
    assert str(plugged.directory) in message
    others = [name for name in PLUGGED_IN_FILES if name != missing]
    assert not any(name in message for name in others), "name only what is missing"


def test_missing_cert_dir_names_every_file(tmp_path: Path) -> None:
    with pytest.raises(CaSetupError) as caught:
        CertificateAuthority.load(CaSettings(cert_dir=tmp_path / "nowhere"))
    assert all(name in str(caught.value) for name in PLUGGED_IN_FILES)


def test_plugged_in_key_not_matching_the_certificate_is_a_setup_error(tmp_path: Path) -> None:
    """ca-key.pem must be the key of ca-cert.pem, or every certificate signed fails to verify."""
    plugged = write_plugged_in(tmp_path / "cacerts")
    (plugged.directory / "ca-key.pem").write_bytes(new_ca("unrelated").key_pem)
    try:
        ca = CertificateAuthority.load(CaSettings(cert_dir=plugged.directory))
    except CaSetupError as error:
        assert "ca-key.pem" in str(error)
    else:
        chain = load_chain(ca.sign(make_csr()[1], Identity.parse(spiffe(*CALLER)), HOUR))
        pytest.fail(
            "loaded a ca-key.pem that is not ca-cert.pem's key; the leaf it signs "
            f"{_verdict(chain[0], plugged.intermediate.cert)} under ca-cert.pem"
        )


def test_plugged_in_certificate_not_under_the_root_is_a_setup_error(tmp_path: Path) -> None:
    """ca-cert.pem must chain to root-cert.pem, or workloads trust a root that signed nothing."""
    plugged = write_plugged_in(tmp_path / "cacerts")
    other_root = new_ca("another root")
    (plugged.directory / "root-cert.pem").write_text(other_root.cert_pem)
    try:
        ca = CertificateAuthority.load(CaSettings(cert_dir=plugged.directory))
    except CaSetupError as error:
        assert "root-cert.pem" in str(error)
    else:
        chain = load_chain(ca.sign(make_csr()[1], Identity.parse(spiffe(*CALLER)), HOUR))
        names = [c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value for c in chain[1:]]
        pytest.fail(
            "loaded a ca-cert.pem that root-cert.pem did not issue; it serves the chain "
            f"leaf -> {' -> '.join(map(str, names))}, whose intermediate "
            f"{_verdict(plugged.intermediate.cert, other_root.cert)} under the root it announces"
        )


async def test_cli_exits_2_naming_the_missing_file(tmp_path: Path) -> None:
    plugged = write_plugged_in(tmp_path / "cacerts")
    (plugged.directory / "ca-key.pem").unlink()
    config = tmp_path / "mesh.yaml"
    write_mesh(config, MESH)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CA_", "KUBECONFIG"))}
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pilot",
        "discovery",
        "--config",
        str(config),
        "--ca-cert-dir",
        str(plugged.directory),
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    _, err = await bounded(process.communicate(), 30)
    stderr = err.decode()
    assert process.returncode == 2, stderr
    assert f"pilot: error: --ca-cert-dir {plugged.directory} lacks ca-key.pem" in stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "xdg").exists(), "no self-signed root made instead"
