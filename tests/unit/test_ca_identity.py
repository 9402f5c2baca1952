"""SPIFFE identities as Istio writes them, and the settings that name accounts.

`Identity.parse` accepts exactly `spiffe://TD/ns/NS/sa/SA`; Kubernetes user names
`system:serviceaccount:NS:SA` map to the same identities; CA_TRUSTED_NODE_ACCOUNTS
and POD_NAMESPACE / SERVICE_ACCOUNT are read into them. Wherever the parts come
from, an `Identity` exists only with a valid Kubernetes namespace (DNS-1123
label), service account (DNS-1123 subdomain) and a DNS trust domain; otherwise
ValueError (SecuritySettingsError for settings) names the part and the rule.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilot.security import identity
from pilot.security.certs import cert_pem, self_signed_root
from pilot.security.identity import Identity
from pilot.security.settings import (
    SecuritySettingsError,
    own_identity,
    own_namespace,
    remote_ca_from_env,
    trusted_accounts,
)

# Kubernetes' own patterns (k8s.io/apimachinery/pkg/util/validation), for comparison.
K8S_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
K8S_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

BAD_NAMESPACES = [
    "",
    ".",
    "..",
    "a/b",
    "../kube-system",
    "Shop",
    "shop_1",
    "-shop",
    "shop-",
    "shop.prod",
    "a" * 64,
    "shop\n",
    " shop",
    "sh\x00op",
    "caf\u00e9",
    "*",
]
BAD_SERVICE_ACCOUNTS = [
    "",
    ".",
    "..",
    "x/y",
    "../admin",
    ".web",
    "web.",
    "web..v1",
    "Web",
    "web_1",
    "-web",
    "web-",
    "web\n",
    "a" * 254,
    "web:admin",
    "%2e%2e",
]
BAD_TRUST_DOMAINS = [
    "",
    "Cluster.local",
    "cluster..local",
    "cluster.local.",
    ".cluster.local",
    "evil/cluster.local",
    "td_1",
    "a" * 64 + ".local",
    "cluster.local:443",
    "user@cluster.local",
]


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


# ------------------------------------------------------------------ valid names only


@pytest.mark.parametrize("namespace", ["a", "0", "shop", "kube-system", "a1-b2", "a" * 63])
@pytest.mark.parametrize("account", ["web", "default", "web.v1", "a-b.c-d", "1", "a" * 253])
def test_kubernetes_names_are_identities(namespace: str, account: str) -> None:
    identity = Identity("cluster.local", namespace, account)
    assert Identity.parse(identity.uri) == identity
    username = f"system:serviceaccount:{namespace}:{account}"
    assert Identity.from_username(username, "cluster.local") == identity


@pytest.mark.parametrize("namespace", BAD_NAMESPACES)
def test_invalid_namespace_is_no_identity(namespace: str) -> None:
    with pytest.raises(ValueError, match="is not a valid Kubernetes namespace") as caught:
        Identity("cluster.local", namespace, "web")
    assert "DNS-1123 label" in str(caught.value), "say what a namespace must be"


@pytest.mark.parametrize("account", BAD_SERVICE_ACCOUNTS)
def test_invalid_service_account_is_no_identity(account: str) -> None:
    with pytest.raises(ValueError, match=r"service account .* is not a valid Kubernetes name"):
        Identity("cluster.local", "shop", account)


@pytest.mark.parametrize("trust_domain", BAD_TRUST_DOMAINS)
def test_invalid_trust_domain_is_no_identity(trust_domain: str) -> None:
    with pytest.raises(ValueError, match="is not a valid DNS name"):
        Identity(trust_domain, "shop", "web")


@pytest.mark.parametrize(
    ("uri", "part"),
    [
        ("spiffe://cluster.local/ns/../sa/web", "namespace '..'"),
        ("spiffe://cluster.local/ns/shop/sa/..", "service account '..'"),
        ("spiffe://cluster.local/ns/Shop/sa/web", "namespace 'Shop'"),
        ("spiffe://cluster.local/ns/%2e%2e/sa/web", "namespace '%2e%2e'"),
        ("spiffe://cluster.local/ns/shop/sa/web_1", "service account 'web_1'"),
        ("spiffe://Cluster.Local/ns/shop/sa/web", "trust domain 'Cluster.Local'"),
    ],
)
def test_parse_refuses_invalid_parts(uri: str, part: str) -> None:
    with pytest.raises(ValueError) as caught:
        Identity.parse(uri)
    message = str(caught.value)
    assert f"invalid SPIFFE identity {uri!r}" in message
    assert part in message


def test_parse_refuses_a_path_in_the_service_account() -> None:
    with pytest.raises(ValueError, match="not a SPIFFE identity"):
        Identity.parse("spiffe://cluster.local/ns/shop/sa/x/y")


@pytest.mark.parametrize(
    ("username", "part"),
    [
        ("system:serviceaccount:..:x/y", "namespace '..'"),
        ("system:serviceaccount:shop:../admin", "service account '../admin'"),
        ("system:serviceaccount:shop:x/y", "service account 'x/y'"),
        ("system:serviceaccount:Shop:web", "namespace 'Shop'"),
        ("system:serviceaccount:shop:web\x7f", "service account 'web\\x7f'"),
    ],
)
def test_from_username_refuses_invalid_names(username: str, part: str) -> None:
    with pytest.raises(ValueError) as caught:
        Identity.from_username(username, "cluster.local")
    assert part in str(caught.value)


def test_a_long_rejected_value_is_cut_short_in_the_message() -> None:
    with pytest.raises(ValueError) as caught:
        Identity("cluster.local", "x" * 10_000, "web")
    assert len(str(caught.value)) < 300


@given(st.text(max_size=70), st.text(max_size=70))
def test_an_identity_is_made_of_kubernetes_names_only(namespace: str, account: str) -> None:
    """Whatever the text: either refused, or names Kubernetes accepts that round-trip."""
    try:
        identity = Identity("cluster.local", namespace, account)
    except ValueError:
        valid = K8S_LABEL.fullmatch(namespace) and len(namespace) <= 63
        valid = valid and K8S_SUBDOMAIN.fullmatch(account) and len(account) <= 253
        assert not valid, f"refused the valid names {namespace!r}, {account!r}"
        return
    assert K8S_LABEL.fullmatch(namespace) and len(namespace) <= 63
    assert K8S_SUBDOMAIN.fullmatch(account)
    assert Identity.parse(identity.uri) == identity


@given(st.from_regex(K8S_LABEL, fullmatch=True), st.from_regex(K8S_SUBDOMAIN, fullmatch=True))
def test_every_kubernetes_name_is_accepted(namespace: str, account: str) -> None:
    if len(namespace) > 63 or len(account) > 253:
        return
    assert Identity.parse(f"spiffe://cluster.local/ns/{namespace}/sa/{account}") == Identity(
        "cluster.local", namespace, account
    )


# ------------------------------------------------------------------ settings


def test_trusted_node_accounts() -> None:
    env = {"CA_TRUSTED_NODE_ACCOUNTS": " kube-system/ztunnel, istio-system/agent ,"}
    assert trusted_accounts(env) == ("kube-system/ztunnel", "istio-system/agent")
    assert trusted_accounts({}) == ()


@pytest.mark.parametrize("value", ["ztunnel", "a/b/c", "kube-system/ztunnel,agent", "../x/y"])
def test_trusted_node_accounts_must_be_ns_slash_sa(value: str) -> None:
    with pytest.raises(SecuritySettingsError, match="is not ns/sa"):
        trusted_accounts({"CA_TRUSTED_NODE_ACCOUNTS": value})


@pytest.mark.parametrize(
    ("value", "part"),
    [
        ("../ztunnel", "namespace '..'"),
        ("Kube-System/ztunnel", "namespace 'Kube-System'"),
        ("kube-system/..", "service account '..'"),
        ("kube-system/ztunnel_1", "service account 'ztunnel_1'"),
        ("/ztunnel", "namespace ''"),
        ("kube-system/", "service account ''"),
    ],
)
def test_trusted_node_accounts_must_be_kubernetes_names(value: str, part: str) -> None:
    env = {"CA_TRUSTED_NODE_ACCOUNTS": f"istio-system/agent,{value}"}
    with pytest.raises(SecuritySettingsError) as caught:
        trusted_accounts(env)
    assert str(caught.value).startswith("CA_TRUSTED_NODE_ACCOUNTS: ")
    assert part in str(caught.value)


def test_own_identity() -> None:
    env = {"POD_NAMESPACE": "istio-system", "SERVICE_ACCOUNT": "istiod"}
    assert own_identity(env, "cluster.local") == Identity("cluster.local", "istio-system", "istiod")
    assert own_identity({"POD_NAMESPACE": "istio-system"}, "cluster.local") is None


@pytest.mark.parametrize(
    ("env", "part"),
    [
        ({"POD_NAMESPACE": "..", "SERVICE_ACCOUNT": "istiod"}, "namespace '..'"),
        ({"POD_NAMESPACE": "istio-system", "SERVICE_ACCOUNT": "x/y"}, "service account 'x/y'"),
    ],
)
def test_own_identity_must_be_kubernetes_names(env: dict[str, str], part: str) -> None:
    with pytest.raises(SecuritySettingsError) as caught:
        own_identity(env, "cluster.local")
    assert str(caught.value).startswith("POD_NAMESPACE / SERVICE_ACCOUNT: ")
    assert part in str(caught.value)


def test_own_identity_needs_a_valid_trust_domain() -> None:
    env = {"POD_NAMESPACE": "istio-system", "SERVICE_ACCOUNT": "istiod"}
    with pytest.raises(SecuritySettingsError, match=r"^--trust-domain: trust domain 'Evil/TD'"):
        own_identity(env, "Evil/TD")


def test_own_namespace() -> None:
    assert own_namespace({}) == "default"
    assert own_namespace({"POD_NAMESPACE": " istio-system "}) == "istio-system"
    with pytest.raises(SecuritySettingsError, match=r"^POD_NAMESPACE: namespace '../x'"):
        own_namespace({"POD_NAMESPACE": "../x"})


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


# ------------------------------------------------------------------ remembered names


def test_a_refused_name_is_refused_every_time_however_many_pass() -> None:
    """Valid names are remembered (an arrival checks its identity several times); a
    refused one is never, and a flood of valid ones keeps the memory bounded."""
    for _ in range(2):
        with pytest.raises(ValueError, match="namespace"):
            Identity("cluster.local", "Not-A-Label", "sa")
        with pytest.raises(ValueError, match="not a SPIFFE identity"):
            Identity.parse("spiffe://cluster.local/ns/a/sa/b/c")
    for index in range(identity.REMEMBERED + 100):
        Identity.parse(f"spiffe://cluster.local/ns/ns-{index}/sa/sa-{index}")
    for check in (identity.check_namespace, identity.check_service_account, identity._parse):
        assert check.cache_info().currsize <= identity.REMEMBERED
    with pytest.raises(ValueError, match="service account"):
        Identity("cluster.local", "ns-1", "sa-1/..")
    with pytest.raises(ValueError, match="trust domain"):
        Identity.parse("spiffe://Cluster.Local/ns/ns-1/sa/sa-1")
    assert Identity.parse("spiffe://cluster.local/ns/ns-1/sa/sa-1") == Identity(
        "cluster.local", "ns-1", "sa-1"
    )
