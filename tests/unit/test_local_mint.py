"""pilot's own CA minting its proxies' keys and certificates (`LocalCa.mint`), called directly.

- The certificate names the identity pilot gives it and nothing a CSR could
  ask for (there is none), with the same extensions as a certificate signed
  for a CSR, under the same chain; its key is the one handed out with it.
- A leaf that does not certify the key made with it is never handed out.
- An expired CA mints nothing, as it signs nothing: a CA error SDS retries.
- Mints go to threads in batches; each job's failure is its own, a caller that
  gave up is skipped, and every caller of a burst gets its own key.
- The secret manager mints with pilot's own CA and never sends it a CSR; with
  any other CA it sends a CSR (the CA_ADDR path over gRPC is tested in
  tests/integration/test_ca_remote.py).
"""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pilot.security import ca as ca_module
from pilot.security.ca import CaSettings, CertificateAuthority, Leaf
from pilot.security.ca_client import MINT_BATCH, CaError, LocalCa
from pilot.security.certs import (
    KeyType,
    WorkloadCertificate,
    load_certificates,
    public_key_der,
    verify_chain,
)
from pilot.security.identity import Identity
from pilot.security.secrets import SdsSettings, SecretManager
from pilot.xds.proxy import ProxyKey
from tests.support.ca import make_csr, new_ca, utcnow
from tests.support.deadline import bounded

PROXY = Identity("cluster.local", "shop", "cart")
OTHER = Identity("cluster.local", "bank", "vault")
DAY = datetime.timedelta(days=1)
HOUR = datetime.timedelta(hours=1)


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.load(CaSettings(state_dir=tmp_path / "ca"))


def _chain(certificate: WorkloadCertificate) -> list[x509.Certificate]:
    return load_certificates(certificate.chain_pem)


def _uris(leaf: x509.Certificate) -> list[str]:
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.UniformResourceIdentifier)


def _spki(key: Any) -> bytes:
    return key.public_bytes(  # type: ignore[no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


async def test_minted_certificate_names_the_given_identity_under_the_cas_root(
    ca: CertificateAuthority,
) -> None:
    minted = await LocalCa(ca, asyncio.Semaphore(1)).mint(KeyType.EC, PROXY, DAY)
    chain = _chain(minted)
    verify_chain(chain, [ca.root])
    assert chain[-1] == ca.root
    assert _uris(chain[0]) == [PROXY.uri]
    key = serialization.load_pem_private_key(minted.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert _spki(key.public_key()) == _spki(chain[0].public_key()), "key is not the leaf's"
    assert minted.serial == chain[0].serial_number
    assert minted.expires == chain[0].not_valid_after_utc
    assert "PRIVATE" not in repr(minted), "the private key shows in a repr"


async def test_minted_certificate_is_the_one_a_csr_would_get(ca: CertificateAuthority) -> None:
    """Same extensions, same issuer, as the certificate CreateCertificate signs for a CSR."""
    minted = _chain(await LocalCa(ca, asyncio.Semaphore(1)).mint(KeyType.EC, PROXY, DAY))[0]
    signed = load_certificates("".join(ca.sign(make_csr()[1], PROXY, DAY)).encode())[0]

    def shape(leaf: x509.Certificate) -> list[tuple[str, bool, object]]:
        kept = []
        for extension in leaf.extensions:
            value: object = extension.value
            if isinstance(value, x509.SubjectKeyIdentifier):
                own = x509.SubjectKeyIdentifier.from_public_key(leaf.public_key())
                value = value.digest == own.digest  # each leaf's own key, not equal across them
            kept.append((extension.oid.dotted_string, extension.critical, value))
        return kept

    assert shape(minted) == shape(signed)
    assert minted.issuer == signed.issuer
    assert minted.signature_hash_algorithm.name == signed.signature_hash_algorithm.name  # type: ignore[union-attr]


async def test_rsa_keys_are_minted_too(ca: CertificateAuthority) -> None:
    minted = await LocalCa(ca, asyncio.Semaphore(1)).mint(KeyType.RSA, PROXY, DAY)
    key = serialization.load_pem_private_key(minted.key_pem, password=None)
    assert _spki(key.public_key()) == _spki(_chain(minted)[0].public_key())


async def test_a_leaf_for_another_key_is_never_handed_out(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    stranger = public_key_der(ec.generate_private_key(ec.SECP256R1()).public_key())
    issue = ca.issue_workload
    monkeypatch.setattr(ca, "issue_workload", lambda _key, who, ttl: issue(stranger, who, ttl))
    with pytest.raises(CaError, match="different key"):
        await LocalCa(ca, asyncio.Semaphore(1)).mint(KeyType.EC, PROXY, DAY)


async def test_an_expired_ca_mints_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    issuer = new_ca("expires in an hour", valid_for=HOUR)
    ca = CertificateAuthority(issuer.key, issuer.cert, [issuer.cert], issuer.cert, CaSettings())
    later = utcnow() + 2 * HOUR
    monkeypatch.setattr(ca_module, "utcnow", lambda: later)
    with pytest.raises(CaError, match=r"^pilot's CA: the CA's certificate expired at "):
        await LocalCa(ca, asyncio.Semaphore(1)).mint(KeyType.EC, PROXY, DAY)


async def test_a_burst_gets_one_key_each_and_every_caller_an_answer(
    ca: CertificateAuthority,
) -> None:
    local = LocalCa(ca, asyncio.Semaphore(2))
    count = 3 * MINT_BATCH[KeyType.EC] + 5
    identities = [Identity("cluster.local", "ns", f"sa-{i}") for i in range(count)]
    minted = await asyncio.gather(*(local.mint(KeyType.EC, i, DAY) for i in identities))
    assert [_uris(_chain(m)[0]) for m in minted] == [[i.uri] for i in identities]
    assert len({m.key_pem for m in minted}) == count, "two proxies share a key"
    assert len({m.serial for m in minted}) == count


async def test_one_failed_job_does_not_fail_its_batch(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    issue = ca.issue_workload

    def refuse_other(spki: bytes, who: Identity, ttl: datetime.timedelta) -> Leaf:
        if who == OTHER:
            raise RuntimeError("a fault while minting")
        return issue(spki, who, ttl)

    monkeypatch.setattr(ca, "issue_workload", refuse_other)
    local = LocalCa(ca, asyncio.Semaphore(1))
    outcomes = await asyncio.gather(
        local.mint(KeyType.EC, PROXY, DAY),
        local.mint(KeyType.EC, OTHER, DAY),
        local.mint(KeyType.EC, PROXY, DAY),
        return_exceptions=True,
    )
    assert isinstance(outcomes[1], RuntimeError)
    assert all(isinstance(o, WorkloadCertificate) for o in (outcomes[0], outcomes[2]))


async def test_a_caller_that_gave_up_is_skipped_and_the_rest_answered(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    minted_for: list[Identity] = []
    issue = ca.issue_workload

    def spy(spki: bytes, who: Identity, ttl: datetime.timedelta) -> Leaf:
        minted_for.append(who)
        return issue(spki, who, ttl)

    monkeypatch.setattr(ca, "issue_workload", spy)
    slots = asyncio.Semaphore(1)
    local = LocalCa(ca, slots)
    async with slots:  # the CA is busy: both jobs wait in the queue
        gone = asyncio.create_task(local.mint(KeyType.EC, OTHER, DAY))
        kept = asyncio.create_task(local.mint(KeyType.EC, PROXY, DAY))
        await asyncio.sleep(0)  # both queued
        gone.cancel()
    assert _uris(_chain(await kept)[0]) == [PROXY.uri]
    assert minted_for == [PROXY], "a key was made for a caller that had gone"
    with pytest.raises(asyncio.CancelledError):
        await gone


class _CsrOnlyCa:
    """A CA client other than pilot's own: it only signs CSRs (as CA_ADDR's does)."""

    def __init__(self, ca: CertificateAuthority) -> None:
        self.ca = ca
        self.csrs: list[bytes] = []

    async def sign(self, csr_pem: bytes, identity: Identity, ttl: datetime.timedelta) -> list[str]:
        self.csrs.append(csr_pem)
        return self.ca.sign(csr_pem, identity, ttl)


async def _served(secrets: SecretManager, proxy: ProxyKey) -> WorkloadCertificate:
    ready = asyncio.Event()
    assert secrets.want(proxy, lambda _proxy: ready.set())
    await bounded(ready.wait(), 30)
    served = secrets.current(proxy)
    assert served is not None
    await secrets.close()
    return served


async def test_secret_manager_mints_with_pilots_own_ca_without_a_csr(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_csr(*_args: object) -> list[str]:
        raise AssertionError("pilot's own CA was sent a CSR")

    monkeypatch.setattr(ca, "sign", no_csr)
    secrets = SecretManager(LocalCa(ca, asyncio.Semaphore(1)), ca.root_pem, SdsSettings())
    served = await _served(secrets, ProxyKey("proxy-1", PROXY.uri))
    assert _uris(_chain(served)[0]) == [PROXY.uri]


async def test_secret_manager_sends_any_other_ca_a_csr(ca: CertificateAuthority) -> None:
    remote = _CsrOnlyCa(ca)
    secrets = SecretManager(remote, ca.root_pem, SdsSettings())
    served = await _served(secrets, ProxyKey("proxy-1", PROXY.uri))
    assert len(remote.csrs) == 1
    assert x509.load_pem_x509_csr(remote.csrs[0]).is_signature_valid
    assert _uris(_chain(served)[0]) == [PROXY.uri]
