"""Who is calling: `Authenticator` with client certificates and tokens, and `bearer_token`.

Client certificates are handed over as gRPC's auth context does it
(`{"x509_pem_cert": [pem_bytes]}`); the caller is the certificate's SPIFFE URI
in pilot's trust domain, provided pilot's CA issued the certificate and it is
valid now. Tokens go to a `TokenReviewer` (a stub here) for the configured
audiences. Every refusal is an `AuthError` saying why.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import pytest

from pilot.security.authn import Authenticator, AuthError, bearer_token
from pilot.security.identity import Identity
from tests.support.ca import (
    Issuer,
    Token,
    issue_leaf,
    make_csr,
    new_ca,
    pem,
    spiffe,
    utcnow,
)

ISSUER = new_ca("unit test CA")
CALLER = Identity("cluster.local", "ns1", "sa1")


def _client_cert(
    *uris: str,
    hosts: Sequence[str] = (),
    issuer: Issuer = ISSUER,
    starts: datetime.datetime | None = None,
) -> bytes:
    key, _ = make_csr()
    leaf = issue_leaf(issuer, key.public_key(), uris, hosts=hosts, starts=starts)
    return pem(leaf).encode()


class StubReviewer:
    """Answers TokenReviews from a table; records the audiences it was asked for."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users
        self.asked: list[tuple[str, ...]] = []

    async def review(self, token: str, audiences: Sequence[str]) -> str:
        self.asked.append(tuple(audiences))
        if token not in self.users:
            raise AuthError("token rejected: [invalid bearer token]")
        return self.users[token]


def _authenticator(
    trust_domain: str = "cluster.local", reviewer: StubReviewer | None = None
) -> Authenticator:
    """An Authenticator whose CA is ISSUER (client certificates count only if it issued them)."""
    return Authenticator(trust_domain, reviewer, issuers=[ISSUER.cert])


def _context(certificate: bytes) -> dict[str, list[bytes]]:
    return {"x509_pem_cert": [certificate], "transport_security_type": [b"ssl"]}


# ------------------------------------------------------------------ client certificates


def test_certificate_identity_is_its_spiffe_uri() -> None:
    authenticator = _authenticator()
    identity = authenticator.from_certificate(_context(_client_cert(CALLER.uri)))
    assert identity == CALLER


def test_certificate_identity_skips_uris_of_other_shapes_and_domains() -> None:
    certificate = _client_cert(
        "https://example.com/not-spiffe",
        spiffe("ns9", "sa9", trust_domain="other.domain"),
        "spiffe://cluster.local/workload/x",
        CALLER.uri,
    )
    identity = _authenticator().from_certificate(_context(certificate))
    assert identity == CALLER


@pytest.mark.parametrize(
    "uris",
    [
        (spiffe("ns1", "sa1", trust_domain="other.domain"),),
        ("https://example.com/ns/ns1/sa/sa1",),
        ("spiffe://cluster.local/ns1/sa1",),
        (),
    ],
    ids=["other-trust-domain", "not-spiffe", "not-istio-shaped", "no-uri"],
)
def test_certificate_without_an_identity_in_the_trust_domain_is_refused(
    uris: tuple[str, ...],
) -> None:
    certificate = _client_cert(*uris, hosts=("workload.example",))
    with pytest.raises(AuthError) as caught:
        _authenticator().from_certificate(_context(certificate))
    assert "no SPIFFE identity in cluster.local" in str(caught.value)


@pytest.mark.parametrize(
    ("uri", "part"),
    [
        ("spiffe://cluster.local/ns/../sa/sa1", "namespace '..'"),
        ("spiffe://cluster.local/ns/NS1/sa/sa1", "namespace 'NS1'"),
        ("spiffe://cluster.local/ns/ns1/sa/..", "service account '..'"),
    ],
)
def test_certificate_naming_an_invalid_account_is_refused(uri: str, part: str) -> None:
    """Even from this CA (a plugged-in one may have signed anything): names must be valid."""
    with pytest.raises(AuthError) as caught:
        _authenticator().from_certificate(_context(_client_cert(uri)))
    message = str(caught.value)
    assert "no SPIFFE identity in cluster.local" in message
    assert part in message, "say what is wrong with it"


def test_certificate_with_an_invalid_and_a_valid_identity_is_the_valid_one() -> None:
    certificate = _client_cert("spiffe://cluster.local/ns/../sa/sa1", CALLER.uri)
    assert _authenticator().from_certificate(_context(certificate)) == CALLER


def test_certificate_from_another_ca_is_refused() -> None:
    certificate = _client_cert(CALLER.uri, issuer=new_ca("someone else's CA"))
    with pytest.raises(AuthError, match="not issued by this CA"):
        _authenticator().from_certificate(_context(certificate))


def test_certificate_signed_by_another_key_in_the_cas_name_is_refused() -> None:
    key, _ = make_csr()
    forger = new_ca("forger").key
    forged = issue_leaf(ISSUER, key.public_key(), [CALLER.uri], signing_key=forger)
    with pytest.raises(AuthError, match="not issued by this CA"):
        _authenticator().from_certificate(_context(pem(forged).encode()))


@pytest.mark.parametrize(
    "starts",
    [utcnow() - datetime.timedelta(hours=3), utcnow() + datetime.timedelta(hours=1)],
    ids=["expired", "not-yet-valid"],
)
def test_certificate_outside_its_validity_is_refused(starts: datetime.datetime) -> None:
    certificate = _client_cert(CALLER.uri, starts=starts)
    with pytest.raises(AuthError, match="expired or not yet valid"):
        _authenticator().from_certificate(_context(certificate))


@pytest.mark.parametrize("context", [{}, {"x509_pem_cert": []}, {"transport_security_type": []}])
def test_no_client_certificate_is_no_identity(context: dict[str, list[bytes]]) -> None:
    assert _authenticator().from_certificate(context) is None


def test_trust_domain_is_the_authenticators() -> None:
    certificate = _client_cert(spiffe("ns1", "sa1", trust_domain="mesh.example"))
    identity = _authenticator("mesh.example").from_certificate(_context(certificate))
    assert identity == Identity("mesh.example", "ns1", "sa1")


# ------------------------------------------------------------------ authenticate()


async def test_certificate_authenticates_without_a_token() -> None:
    authenticator = _authenticator(reviewer=StubReviewer({}))
    identity = await authenticator.authenticate({}, _context(_client_cert(CALLER.uri)))
    assert identity == CALLER


async def test_token_is_preferred_to_a_certificate() -> None:
    token = Token("token-of-ns2-sa2")
    reviewer = StubReviewer({token: "system:serviceaccount:ns2:sa2"})
    authenticator = _authenticator(reviewer=reviewer)
    identity = await authenticator.authenticate(
        {"authorization": f"Bearer {token}"}, _context(_client_cert(CALLER.uri))
    )
    assert identity == Identity("cluster.local", "ns2", "sa2")
    assert reviewer.asked == [("istio-ca",)]


async def test_token_is_reviewed_for_the_configured_audiences() -> None:
    token = Token("token-of-ns1-sa1")
    reviewer = StubReviewer({token: "system:serviceaccount:ns1:sa1"})
    authenticator = Authenticator("cluster.local", reviewer, audiences=("a", "b"))
    assert await authenticator.authenticate({"authorization": f"Bearer {token}"}, {}) == CALLER
    assert reviewer.asked == [("a", "b")]


async def test_rejected_token_is_refused_even_with_a_good_certificate() -> None:
    authenticator = _authenticator(reviewer=StubReviewer({}))
    with pytest.raises(AuthError) as caught:
        await authenticator.authenticate(
            {"authorization": "Bearer forged"}, _context(_client_cert(CALLER.uri))
        )
    assert "token rejected" in str(caught.value)


async def test_no_credentials_says_what_to_send() -> None:
    with pytest.raises(AuthError) as caught:
        await _authenticator(reviewer=StubReviewer({})).authenticate({}, {})
    message = str(caught.value)
    assert "authorization: Bearer" in message
    assert "client certificate" in message


async def test_token_without_a_kubernetes_api_is_refused() -> None:
    with pytest.raises(AuthError) as caught:
        await _authenticator().authenticate({"authorization": "Bearer whatever"}, {})
    assert "TokenReview" in str(caught.value)


@pytest.mark.parametrize("username", ["alice", "system:node:node-1", "system:serviceaccount:ns1"])
async def test_token_of_something_else_than_a_service_account_is_refused(username: str) -> None:
    token = Token("token-of-someone")
    authenticator = _authenticator(reviewer=StubReviewer({token: username}))
    with pytest.raises(AuthError) as caught:
        await authenticator.from_token(token)
    assert "not a service account" in str(caught.value)
    assert token not in str(caught.value)


@pytest.mark.parametrize(
    ("username", "part"),
    [
        ("system:serviceaccount:..:x/y", "namespace '..'"),
        ("system:serviceaccount:ns1:../../admin", "service account '../../admin'"),
        ("system:serviceaccount:ns1:sa1/extra", "service account 'sa1/extra'"),
        ("system:serviceaccount:NS1:sa1", "namespace 'NS1'"),
    ],
)
async def test_token_naming_an_invalid_account_is_refused(username: str, part: str) -> None:
    """TokenReview's answer is checked too: `..` or `/` never becomes a SPIFFE path."""
    token = Token("token-of-a-strange-account")
    authenticator = _authenticator(reviewer=StubReviewer({token: username}))
    with pytest.raises(AuthError) as caught:
        await authenticator.authenticate({"authorization": f"Bearer {token}"}, {})
    message = str(caught.value)
    assert message.startswith("token does not name a valid service account: ")
    assert part in message
    assert token not in message


# ------------------------------------------------------------------ bearer_token()


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("abc", None),
        ("", None),
    ],
)
def test_bearer_token(header: str, expected: str | None) -> None:
    assert bearer_token({"authorization": header}) == expected


def test_no_authorization_header_is_no_token() -> None:
    assert bearer_token({"x-other": "Bearer abc"}) is None
