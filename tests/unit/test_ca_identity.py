"""SPIFFE identities as Istio writes them, and the settings that name accounts.

`Identity.parse` accepts exactly `spiffe://TD/ns/NS/sa/SA`; Kubernetes user names
`system:serviceaccount:NS:SA` map to the same identities; CA_TRUSTED_NODE_ACCOUNTS
and POD_NAMESPACE / SERVICE_ACCOUNT are read into them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pilot.security.certs import cert_pem, self_signed_root
from pilot.security.identity import Identity
from pilot.security.settings import (
    SecuritySettingsError,
    own_identity,
    remote_ca_from_env,
    trusted_accounts,
)


def test_parse_and_uri_round_trip() -> None:
    identity = Identity.parse("spiffe://cluster.local/ns/shop/sa/web")
    assert identity == Identity("cluster.local", "shop", "web")
    assert identity.uri == "spiffe://cluster.local/ns/shop/sa/web"
    assert str(identity) == identity.uri
    assert identity.account == "shop/web"


def test_parse_keeps_the_trust_domain() -> None:
    identity = Identity.parse("spiffe://mesh.example.com/ns/a/sa/b")
    assert identity.trust_domain == "mesh.example.com"


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "ns/shop/sa/web",
        "spiffe://cluster.local",
        "spiffe://cluster.local/",
        "spiffe://cluster.local/ns/shop",
        "spiffe://cluster.local/ns/shop/sa/",
        "spiffe://cluster.local/ns//sa/web",
        "spiffe:///ns/shop/sa/web",
        "spiffe://cluster.local/sa/web/ns/shop",
        "spiffe://cluster.local/ns/shop/sa/web/extra",
        "spiffe://cluster.local/ns/shop/sa/web/",
        "https://cluster.local/ns/shop/sa/web",
        " spiffe://cluster.local/ns/shop/sa/web",
    ],
)
def test_parse_refuses_what_is_not_istio_shaped(uri: str) -> None:
    with pytest.raises(ValueError, match="not a SPIFFE identity"):
        Identity.parse(uri)


def test_parse_refuses_a_trailing_newline() -> None:
    """`$` also matches before a final newline: the identity must be the whole string."""
    try:
        identity = Identity.parse("spiffe://cluster.local/ns/shop/sa/web\n")
    except ValueError as error:
        assert "not a SPIFFE identity" in str(error)
    else:
        pytest.fail(f"parsed as {identity!r}: a service account named 'web\\n'")


def test_from_username() -> None:
    identity = Identity.from_username("system:serviceaccount:shop:web", "cluster.local")
    assert identity == Identity("cluster.local", "shop", "web")


@pytest.mark.parametrize(
    "username",
    [
        "alice",
        "system:node:node-1",
        "system:serviceaccount:shop",
        "system:serviceaccount:shop:web:extra",
        "system:serviceaccount::web",
        "system:serviceaccounts:shop",
    ],
)
def test_from_username_refuses_other_users(username: str) -> None:
    with pytest.raises(ValueError, match="not a service account"):
        Identity.from_username(username, "cluster.local")


# ------------------------------------------------------------------ settings


def test_trusted_node_accounts() -> None:
    env = {"CA_TRUSTED_NODE_ACCOUNTS": " kube-system/ztunnel, istio-system/agent ,"}
    assert trusted_accounts(env) == ("kube-system/ztunnel", "istio-system/agent")
    assert trusted_accounts({}) == ()


@pytest.mark.parametrize("value", ["ztunnel", "a/b/c", "kube-system/ztunnel,agent"])
def test_trusted_node_accounts_must_be_ns_slash_sa(value: str) -> None:
    with pytest.raises(SecuritySettingsError, match="is not ns/sa"):
        trusted_accounts({"CA_TRUSTED_NODE_ACCOUNTS": value})


def test_own_identity() -> None:
    env = {"POD_NAMESPACE": "istio-system", "SERVICE_ACCOUNT": "istiod"}
    assert own_identity(env, "cluster.local") == Identity("cluster.local", "istio-system", "istiod")
    assert own_identity({"POD_NAMESPACE": "istio-system"}, "cluster.local") is None


def test_remote_ca_needs_a_root_even_in_plaintext() -> None:
    for env in ({"CA_ADDR": "istiod:15012"}, {"CA_ADDR": "ca:15010", "CA_INSECURE": "true"}):
        with pytest.raises(SecuritySettingsError) as caught:
            remote_ca_from_env(env, "cluster.local")
        assert "CA_ROOT_CERT" in str(caught.value)


def test_remote_ca_from_env(tmp_path: Path) -> None:
    assert remote_ca_from_env({}, "cluster.local") is None
    root = tmp_path / "root.pem"
    root.write_text(cert_pem(self_signed_root("cluster.local")[1]))
    env = {
        "CA_ADDR": "istiod:15012",
        "CA_ROOT_CERT": str(root),
        "CA_TOKEN_FILE": str(tmp_path / "token"),
        "POD_NAMESPACE": "istio-system",
        "SERVICE_ACCOUNT": "istiod",
    }
    remote = remote_ca_from_env(env, "cluster.local")
    assert remote is not None
    assert remote.address == "istiod:15012"
    assert remote.root_cert == root
    assert not remote.insecure
    assert remote.token_file == tmp_path / "token"
    assert remote.own_identity == Identity("cluster.local", "istio-system", "istiod")
    insecure = remote_ca_from_env(env | {"CA_INSECURE": "true"}, "x")
    assert insecure is not None and insecure.insecure and insecure.root_cert == root
