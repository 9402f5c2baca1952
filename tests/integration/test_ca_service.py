"""pilot's CA over the wire: `IstioCertificateService/CreateCertificate` on pilot's gRPC port.

A node agent's view, through a real gRPC channel and the generated messages, of
a pilot that checks tokens against the test API server's TokenReview. Each
refusal comes with the right status and a reason, and nothing is signed (a spy
on the CA's `sign` counts). Accepted requests get a chain leaf first, root
last, naming the caller (or, for a trusted node account, the identity it asks
for), backdated two minutes, with the requested or default lifetime, and key
identifiers (the leaf's own, and its issuer's).

Callers that lie are refused next to honest ones that are served: a token of an
account whose name has `..` or `/`, an ImpersonatedIdentity that is no valid
identity, any lifetime an int64 holds beyond the bounds, a CSR asking for other
SANs; and once the CA has expired, everyone gets FAILED_PRECONDITION.

What TokenReview says of real tokens (another audience, `--token-audience`, expired,
unknown) is tested on the real API server: tests/cluster/test_bound_tokens.py.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pilot.security import ca as ca_module
from tests.kubeapi import KubeAPIServer
from tests.support.ca import (
    CaCaller,
    Token,
    assert_issued_chain,
    kube_api,
    load_chain,
    make_csr,
    public_der,
    record_signatures,
    reviews,
    sa_token,
    san_uris,
    spiffe,
    utcnow,
)
from tests.support.mesh import simple_mesh
from tests.support.pilot import RunningPilot, running_pilot

NODE_AGENT = ("kube-system", "node-agent")  # in CA_TRUSTED_NODE_ACCOUNTS
CALLER = ("ns1", "sa1")
VICTIM = ("ns2", "sa2")
MAX_TTL = int(datetime.timedelta(days=90).total_seconds())
TOLERANCE = datetime.timedelta(seconds=15)


class Refusal(NamedTuple):
    """How the CA answered a request it did not sign."""

    code: grpc.StatusCode
    details: str


@dataclass
class Ca:
    """A pilot whose CA checks tokens, a client for it, and what it signed."""

    srv: KubeAPIServer
    pilot: RunningPilot
    caller: CaCaller
    signed: list[str]
    root: x509.Certificate

    def token(
        self, namespace: str, account: str, audiences: tuple[str, ...] = ("istio-ca",)
    ) -> Token:
        return sa_token(self.srv, namespace, account, audiences)

    async def refused(
        self,
        csr: bytes | str,
        *,
        token: Token | None = None,
        validity: int = 0,
        impersonate: str | None = None,
    ) -> Refusal:
        """The refusal a request gets; fails if anything was signed."""
        try:
            chain = await self.caller.create(
                csr, token=token, validity=validity, impersonate=impersonate
            )
        except grpc.aio.AioRpcError as error:
            refusal = Refusal(error.code(), error.details() or "")
        else:
            pytest.fail(f"signed a certificate for {san_uris(load_chain(chain)[0])} instead")
        assert self.signed == [], "a refused request must not be signed"
        leaked = token is not None and token in refusal.details
        assert not leaked, "the refusal message repeats the caller's token"
        return refusal


@pytest.fixture
async def ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Ca]:
    async with kube_api(tmp_path) as (srv, kubeconfig):
        security = {"trusted_node_accounts": ("/".join(NODE_AGENT),)}
        async with running_pilot(
            tmp_path, simple_mesh({"a": ["10.0.0.1"]}), security=security, kubeconfig=kubeconfig
        ) as pilot:
            assert pilot.discovery.security is not None
            signed = record_signatures(monkeypatch, pilot.discovery.security.ca)
            root = load_chain((tmp_path / "ca" / "root-cert.pem").read_text())[0]
            async with CaCaller(pilot.grpc_target) as caller:
                yield Ca(srv, pilot, caller, signed, root)


def _csr_for(*identities: tuple[str, str]) -> bytes:
    return make_csr([spiffe(*i) for i in identities])[1]


# ------------------------------------------------------------------ refusals


async def test_no_token_is_unauthenticated(ca: Ca) -> None:
    refusal = await ca.refused(_csr_for(CALLER))
    assert refusal.code == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization: Bearer" in refusal.details
    assert reviews(ca.srv) == [], "nothing to review without a token"


async def test_credentials_are_checked_before_the_csr(ca: Ca) -> None:
    refusal = await ca.refused("garbage")
    assert refusal.code == grpc.StatusCode.UNAUTHENTICATED


async def test_untrusted_caller_cannot_impersonate(ca: Ca) -> None:
    token = ca.token(*CALLER)
    refusal = await ca.refused(_csr_for(VICTIM), token=token, impersonate=spiffe(*VICTIM))
    assert refusal.code == grpc.StatusCode.PERMISSION_DENIED
    details = refusal.details
    assert spiffe(*CALLER) in details, "say who was refused"
    assert spiffe(*VICTIM) in details, "say what it asked for"
    assert "CA_TRUSTED_NODE_ACCOUNTS" in details, "say how to allow it"


async def test_trusted_node_account_with_a_malformed_identity_is_invalid(ca: Ca) -> None:
    token = ca.token(*NODE_AGENT)
    refusal = await ca.refused(_csr_for(VICTIM), token=token, impersonate="ns2/sa2")
    assert refusal.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "spiffe://" in refusal.details


async def test_trusted_node_account_cannot_impersonate_another_trust_domain(ca: Ca) -> None:
    """This CA is the root of cluster.local: it must not vouch for identities elsewhere."""
    token = ca.token(*NODE_AGENT)
    foreign = spiffe(*VICTIM, trust_domain="evil.example")
    refusal = await ca.refused(_csr_for(VICTIM), token=token, impersonate=foreign)
    assert refusal.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)
    assert "cluster.local" in refusal.details


async def test_garbage_csr_is_invalid(ca: Ca) -> None:
    refusal = await ca.refused("-----BEGIN NONSENSE-----\nxyz\n", token=ca.token(*CALLER))
    assert refusal.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a PEM certificate request" in refusal.details


async def test_empty_csr_is_invalid(ca: Ca) -> None:
    refusal = await ca.refused("", token=ca.token(*CALLER))
    assert refusal.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "CSR" in refusal.details


async def test_oversized_csr_is_invalid(ca: Ca) -> None:
    padding = [spiffe("padding", f"sa-{i:04d}-{'x' * 40}") for i in range(300)]
    _, csr = make_csr([spiffe(*CALLER), *padding])
    x509.load_pem_x509_csr(csr)  # a well-formed CSR, only too big
    assert len(csr) > 16 * 1024
    refusal = await ca.refused(csr, token=ca.token(*CALLER))
    assert refusal.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{len(csr)} bytes" in refusal.details
    assert "16384" in refusal.details


def _tampered_csr() -> bytes:
    """The caller's CSR with one byte of its SAN changed: it parses, but does not verify."""
    _, csr_pem = make_csr([spiffe(*CALLER)])
    der = x509.load_pem_x509_csr(csr_pem).public_bytes(serialization.Encoding.DER)
    altered = der.replace(b"/sa/sa1", b"/sa/sa9")  # same length: still parses
    assert altered != der
    tampered = x509.load_der_x509_csr(altered)
    assert not tampered.is_signature_valid
    return tampered.public_bytes(serialization.Encoding.PEM)


async def test_csr_whose_signature_does_not_verify_is_invalid(ca: Ca) -> None:
    refusal = await ca.refused(_tampered_csr(), token=ca.token(*CALLER))
    assert refusal.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "signature" in refusal.details


@pytest.mark.parametrize("validity", [MAX_TTL + 1, 10 * MAX_TTL, -1])
async def test_lifetime_out_of_bounds_is_invalid(ca: Ca, validity: int) -> None:
    refusal = await ca.refused(_csr_for(CALLER), token=ca.token(*CALLER), validity=validity)
    assert refusal.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(validity) in refusal.details
    if validity > 0:
        assert f"maximum {MAX_TTL}s" in refusal.details


# ------------------------------------------------------------------ callers that lie


@pytest.mark.parametrize(
    ("account", "part"),
    [
        (("..", "x/y"), "namespace '..'"),
        (("ns1", "../../kube-system/sa/admin"), "service account '../../kube-system/sa/admin'"),
        (("kube-system", "node-agent/x"), "service account 'node-agent/x'"),
        (("NS1", "sa1"), "namespace 'NS1'"),
    ],
)
async def test_token_of_an_invalid_account_is_unauthenticated(
    ca: Ca, account: tuple[str, str], part: str
) -> None:
    """What TokenReview says is checked too: `..` or `/` never becomes a SPIFFE path."""
    token = ca.token(*account)
    refusal = await ca.refused(_csr_for(CALLER), token=token)
    assert refusal.code == grpc.StatusCode.UNAUTHENTICATED
    assert "does not name a valid service account" in refusal.details
    assert part in refusal.details
    honest = await ca.caller.create(_csr_for(CALLER), token=ca.token(*CALLER))
    assert san_uris(load_chain(honest)[0]) == [spiffe(*CALLER)], "the honest caller still is"


@pytest.mark.parametrize(
    ("wanted", "part"),
    [
        ("spiffe://cluster.local/ns/../sa/admin", "namespace '..'"),
        ("spiffe://cluster.local/ns/Kube-System/sa/admin", "namespace 'Kube-System'"),
        ("spiffe://cluster.local/ns/ns2/sa/..", "service account '..'"),
        ("spiffe://cluster.local/ns/ns2/sa/sa2/extra", "not a SPIFFE identity"),
        ("spiffe://Cluster.Local/ns/ns2/sa/sa2", "trust domain 'Cluster.Local'"),
    ],
)
async def test_trusted_node_account_asking_for_an_invalid_identity_is_invalid(
    ca: Ca, wanted: str, part: str
) -> None:
    refusal = await ca.refused(_csr_for(VICTIM), token=ca.token(*NODE_AGENT), impersonate=wanted)
    assert refusal.code == grpc.StatusCode.INVALID_ARGUMENT
    assert part in refusal.details


async def test_untrusted_caller_asking_for_an_invalid_identity_is_denied(ca: Ca) -> None:
    """Trust is checked first: a caller not trusted learns nothing about the identity's shape."""
    wanted = "spiffe://cluster.local/ns/../sa/admin"
    refusal = await ca.refused(_csr_for(CALLER), token=ca.token(*CALLER), impersonate=wanted)
    assert refusal.code == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("validity", [2**63 - 1, 2**62, 10**12])
async def test_huge_lifetime_is_invalid(ca: Ca, validity: int) -> None:
    refusal = await ca.refused(_csr_for(CALLER), token=ca.token(*CALLER), validity=validity)
    assert refusal.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refusal.details == f"validity_duration {validity}s exceeds the maximum {MAX_TTL}s"


@pytest.mark.parametrize("validity", [-1, -(2**63)])
async def test_negative_lifetime_is_invalid(ca: Ca, validity: int) -> None:
    refusal = await ca.refused(_csr_for(CALLER), token=ca.token(*CALLER), validity=validity)
    assert refusal.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"validity_duration {validity}s is negative" in refusal.details


async def test_csr_san_tricks_get_the_callers_identity_only(ca: Ca) -> None:
    """A CSR asking for `..` paths, another trust domain, DNS names and IPs: none of it."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier("spiffe://cluster.local/ns/../sa/admin"),
        x509.UniformResourceIdentifier("spiffe://cluster.local/ns/kube-system/sa/admin"),
        x509.UniformResourceIdentifier("spiffe://evil.example/ns/ns1/sa/sa1"),
        x509.DNSName("kubernetes.default.svc"),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
    ]
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "admin")]))
        .add_extension(x509.SubjectAlternativeName(names), critical=True)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    chain = await ca.caller.create(csr, token=ca.token(*CALLER))
    leaf = _leaf_checks(ca, chain, public_der(key), spiffe(*CALLER))
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(san) == [x509.UniformResourceIdentifier(spiffe(*CALLER))]
    assert leaf.subject == x509.Name([])
    assert ca.signed == [spiffe(*CALLER)]


async def test_expired_ca_is_a_failed_precondition(ca: Ca, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the CA's certificate has expired, it refuses rather than sign a dead certificate."""
    after_expiry = ca.root.not_valid_after_utc + datetime.timedelta(seconds=1)
    monkeypatch.setattr(ca_module, "utcnow", lambda: after_expiry)
    refusal = await ca.refused(_csr_for(CALLER), token=ca.token(*CALLER))
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refusal.details == (
        f"the CA's certificate expired at {ca.root.not_valid_after_utc.isoformat()}:"
        " it signs nothing until it is replaced"
    )


# ------------------------------------------------------------------ accepted


def _leaf_checks(ca: Ca, chain: list[str], key_der: bytes, identity: str) -> x509.Certificate:
    certificates = load_chain(chain)
    assert len(chain) == len(certificates) == 2, "leaf, then pilot's self-signed root"
    assert_issued_chain(certificates, ca.root)
    leaf = certificates[0]
    assert san_uris(leaf) == [identity]
    assert public_der(leaf.public_key()) == key_der, "the CSR's key is the one certified"
    constraints = leaf.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert not constraints.ca
    extensions = leaf.extensions
    ski = extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(leaf.public_key())  # type: ignore[arg-type]
    aki = extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    root_ski = ca.root.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == root_ski.digest, "the leaf names its issuer's key id"
    return leaf


async def test_good_token_gets_a_certificate_for_its_identity(ca: Ca) -> None:
    token = ca.token(*CALLER)
    key, csr = make_csr([spiffe(*CALLER)])
    asked = utcnow()
    chain = await ca.caller.create(csr, token=token)
    leaf = _leaf_checks(ca, chain, public_der(key), spiffe(*CALLER))
    expected_not_before = asked - datetime.timedelta(minutes=2)
    assert abs(leaf.not_valid_before_utc - expected_not_before) <= TOLERANCE
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    default = datetime.timedelta(hours=24, minutes=2)  # 24h from now, backdated 2 minutes
    assert abs(lifetime - default) <= datetime.timedelta(seconds=1)
    assert ca.signed == [spiffe(*CALLER)]
    assert reviews(ca.srv) == [(("istio-ca",), True, "system:serviceaccount:ns1:sa1")]


async def test_a_rollout_burst_is_signed_each_for_its_caller_and_a_bad_csr_fails_alone(
    ca: Ca,
) -> None:
    """Calls arriving together are signed in batches: each caller still gets its own
    certificate, for its own key and identity, and one CSR that does not verify is
    refused without costing the others theirs."""
    callers = [(f"ns{i % 5}", f"sa{i}") for i in range(40)]
    made = [make_csr([spiffe(*who)]) for who in callers]
    calls = [
        ca.caller.create(csr, token=ca.token(*who))
        for who, (_, csr) in zip(callers, made, strict=True)
    ]
    calls.insert(17, ca.caller.create(_tampered_csr(), token=ca.token(*CALLER)))
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    refused = outcomes.pop(17)
    assert isinstance(refused, grpc.aio.AioRpcError), refused
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    for chain, who, (key, _) in zip(outcomes, callers, made, strict=True):
        assert isinstance(chain, list), chain
        _leaf_checks(ca, chain, public_der(key), spiffe(*who))
    assert sorted(ca.signed) == sorted(spiffe(*who) for who in callers)


@pytest.mark.parametrize("validity", [3600, MAX_TTL])
async def test_requested_lifetime_is_honoured(ca: Ca, validity: int) -> None:
    key, csr = make_csr([spiffe(*CALLER)])
    chain = await ca.caller.create(csr, token=ca.token(*CALLER), validity=validity)
    leaf = _leaf_checks(ca, chain, public_der(key), spiffe(*CALLER))
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    expected = datetime.timedelta(seconds=validity, minutes=2)
    assert abs(lifetime - expected) <= datetime.timedelta(seconds=1)


async def test_csr_asking_for_someone_else_is_signed_for_the_caller(ca: Ca) -> None:
    key, csr = make_csr([spiffe(*VICTIM), "spiffe://cluster.local/ns/kube-system/sa/admin"])
    chain = await ca.caller.create(csr, token=ca.token(*CALLER))
    _leaf_checks(ca, chain, public_der(key), spiffe(*CALLER))
    assert ca.signed == [spiffe(*CALLER)]


async def test_asking_for_ones_own_identity_needs_no_trust(ca: Ca) -> None:
    key, csr = make_csr([spiffe(*CALLER)])
    chain = await ca.caller.create(csr, token=ca.token(*CALLER), impersonate=spiffe(*CALLER))
    _leaf_checks(ca, chain, public_der(key), spiffe(*CALLER))


async def test_trusted_node_account_gets_the_identity_it_asks_for(ca: Ca) -> None:
    key, csr = make_csr([spiffe(*VICTIM)])
    token = ca.token(*NODE_AGENT)
    chain = await ca.caller.create(csr, token=token, impersonate=spiffe(*VICTIM))
    _leaf_checks(ca, chain, public_der(key), spiffe(*VICTIM))
    assert ca.signed == [spiffe(*VICTIM)]


async def test_trusted_node_account_without_impersonation_gets_its_own(ca: Ca) -> None:
    key, csr = make_csr([spiffe(*VICTIM)])
    chain = await ca.caller.create(csr, token=ca.token(*NODE_AGENT))
    _leaf_checks(ca, chain, public_der(key), spiffe(*NODE_AGENT))
