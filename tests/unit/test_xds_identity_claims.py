"""Node metadata NAMESPACE / SERVICE_ACCOUNT must be Kubernetes names in either `--xds-auth` mode.

`ProxyIdentities.identity_of` is called at a stream's first request. With
`--xds-auth none` the metadata *is* the identity, so a `..` or `/` there would
be minted into a certificate; with `kubernetes` it must match the proof. An
invalid claim is `InvalidClaim` (a PermissionDenied: the stream ends
PERMISSION_DENIED), naming the field and the rule.
"""

from __future__ import annotations

import pytest

from pilot.security.authn import Authenticator
from pilot.security.xds_auth import IdentityMismatch, InvalidClaim, ProxyIdentities, XdsAuth
from pilot.xds.proxy import PermissionDenied
from tests.support.ca import node

TD = "cluster.local"
PROOF = "spiffe://cluster.local/ns/ns1/sa/sa1"
INVALID = [
    (("..", "sa1"), "NAMESPACE", "namespace '..'"),
    (("ns1", "x/y"), "SERVICE_ACCOUNT", "service account 'x/y'"),
    (("ns1/../kube-system", "sa1"), "NAMESPACE", "namespace 'ns1/../kube-system'"),
    (("NS1", "sa1"), "NAMESPACE", "namespace 'NS1'"),
    (("ns1", "sa1\n"), "SERVICE_ACCOUNT", "service account 'sa1\\n'"),
]


def _identities(mode: XdsAuth) -> ProxyIdentities:
    return ProxyIdentities(mode, TD, Authenticator(TD, None))


def test_none_mode_takes_valid_metadata_as_the_identity() -> None:
    assert _identities(XdsAuth.NONE).identity_of(node("p", "ns1", "sa1"), None) == PROOF


def test_none_mode_without_both_claims_is_no_identity() -> None:
    identities = _identities(XdsAuth.NONE)
    assert identities.identity_of(node("p", "ns1"), None) is None
    assert identities.identity_of(node("p"), None) is None


@pytest.mark.parametrize(("claimed", "field", "part"), INVALID)
@pytest.mark.parametrize("mode", list(XdsAuth))
def test_invalid_claim_is_permission_denied(
    mode: XdsAuth, claimed: tuple[str, str], field: str, part: str
) -> None:
    credential = PROOF if mode is XdsAuth.KUBERNETES else None
    with pytest.raises(InvalidClaim) as caught:
        _identities(mode).identity_of(node("p", *claimed), credential)
    assert isinstance(caught.value, PermissionDenied)
    message = str(caught.value)
    assert message.startswith(f"node metadata {field}: ")
    assert part in message


def test_invalid_claim_alone_is_refused_too() -> None:
    """A lone NAMESPACE would not make an identity, but a malformed one is still refused."""
    with pytest.raises(InvalidClaim):
        _identities(XdsAuth.NONE).identity_of(node("p", "../x"), None)


def test_kubernetes_mode_valid_but_different_claim_is_a_mismatch() -> None:
    with pytest.raises(IdentityMismatch):
        _identities(XdsAuth.KUBERNETES).identity_of(node("p", "ns2", "sa1"), PROOF)
    assert _identities(XdsAuth.KUBERNETES).identity_of(node("p", "ns1", "sa1"), PROOF) == PROOF
