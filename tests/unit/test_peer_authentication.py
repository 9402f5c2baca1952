"""PeerAuthentication: what a namespace-wide one sets, and what is refused.

Honest objects beside hostile ones (wrong types, unknown modes, deep nesting),
parsed as the informer and the registry file do, and the store's answer per
namespace. Workload selectors and port-level modes: test_workload_peer_authentication.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from pilot.registry.peer_authentication import (
    MtlsMode,
    PeerAuthenticationKey,
    PeerAuthentications,
    PolicyError,
    parse_peer_authentication,
)
from pilot.sources.file_format import RegistryFileError, parse_registry
from pilot.sources.parse_worker import parse_off_loop


def policy(
    namespace: str, mode: Any = "STRICT", name: str = "default", **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"mtls": {"mode": mode}, **spec},
    }


def test_a_namespace_takes_its_own_mode_else_the_meshs_else_permissive() -> None:
    store = PeerAuthentications()
    assert store.mode_of("shop") is MtlsMode.PERMISSIVE
    assert store.upsert(parse_peer_authentication(policy("istio-system", "STRICT"))) == {
        "istio-system"
    }
    assert store.mode_of("shop") is MtlsMode.STRICT
    store.upsert(parse_peer_authentication(policy("shop", "DISABLE")))
    assert store.mode_of("shop") is MtlsMode.DISABLE
    store.upsert(parse_peer_authentication(policy("cart", "UNSET")))
    assert store.mode_of("cart") is MtlsMode.STRICT, "UNSET inherits the mesh's"
    assert store.delete(PeerAuthenticationKey("shop", "default")) == {"shop"}
    assert store.mode_of("shop") is MtlsMode.STRICT
    assert store.upsert(parse_peer_authentication(policy("cart", "UNSET"))) == frozenset()


def test_the_oldest_namespace_wide_policy_counts() -> None:
    store = PeerAuthentications()
    young = policy("shop", "DISABLE", name="a")
    young["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    old = policy("shop", "STRICT", name="z")
    old["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    store.upsert(parse_peer_authentication(young))
    store.upsert(parse_peer_authentication(old))
    assert store.mode_of("shop") is MtlsMode.STRICT


def test_a_selector_or_port_level_policy_never_weakens_the_rest_of_its_namespace() -> None:
    store = PeerAuthentications()
    store.upsert(parse_peer_authentication(policy("shop", "STRICT")))
    lax = policy("shop", "DISABLE", name="one-pod", selector={"matchLabels": {"app": "x"}})
    ports = policy("shop", "DISABLE", name="ports", portLevelMtls={"8080": {"mode": "DISABLE"}})
    store.upsert(parse_peer_authentication(lax))
    store.upsert(parse_peer_authentication(ports))
    assert store.mode_of("shop") is MtlsMode.STRICT, "the oldest namespace-wide one counts"
    assert store.modes_for("shop", [{"app": "y"}]).ports == (), "the younger one's ports too"
    # A namespace-wide policy that becomes a selector one stops setting the namespace.
    store.upsert(parse_peer_authentication({**policy("shop"), "spec": lax["spec"]}))
    assert store.mode_of("shop") is MtlsMode.DISABLE, "the other namespace-wide one now"


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        (policy("shop", "strict"), "not one of"),
        (policy("shop", 3), "not one of"),
        (policy("shop", ["STRICT"]), "not one of"),
        (policy("shop", "STRICT\nDISABLE"), "not one of"),
        ({**policy("shop"), "spec": ["mtls"]}, "spec must be a mapping"),
        ({**policy("shop"), "spec": {"mtls": "STRICT"}}, "spec.mtls must be a mapping"),
        ({**policy("shop"), "metadata": {"namespace": "shop"}}, "metadata.name is missing"),
        ({**policy("shop"), "metadata": "x"}, "metadata must be a mapping"),
        (policy("shop", selector=["app"]), "spec.selector must be a mapping"),
        (policy("shop", selector={"matchLabels": "app=x"}), "matchLabels must be a mapping"),
        ({**policy("shop"), "metadata": {"name": "a", "namespace": 7}}, "must be a string"),
    ],
)
def test_garbage_is_refused_with_a_line_naming_it(obj: dict[str, Any], says: str) -> None:
    with pytest.raises(PolicyError, match=says) as error:
        parse_peer_authentication(obj)
    assert "\n" not in str(error.value)


def test_deep_nesting_is_a_parse_error_not_a_crash() -> None:
    deep: Any = "STRICT"
    for _ in range(5000):
        deep = {"mode": deep}
    with pytest.raises(PolicyError):
        parse_peer_authentication({**policy("shop"), "spec": {"mtls": deep}})


def test_the_registry_file_accepts_peer_authentications() -> None:
    text = """
apiVersion: security.istio.io/v1beta1
kind: PeerAuthentication
metadata: {name: default, namespace: shop}
spec: {mtls: {mode: STRICT}}
---
kind: List
items:
- apiVersion: security.istio.io/v1
  kind: PeerAuthentication
  metadata: {name: default, namespace: istio-system}
  spec: {mtls: {mode: PERMISSIVE}}
"""
    state = parse_registry(text, "mesh.yaml")
    modes = {p.key.namespace: p.mode for p in state.peer_authentications}
    assert modes == {"shop": MtlsMode.STRICT, "istio-system": MtlsMode.PERMISSIVE}


@pytest.mark.parametrize(
    ("document", "says"),
    [
        (
            "apiVersion: example.com/v1\nkind: PeerAuthentication\nmetadata: {name: a}\n",
            "apiVersion 'example.com/v1' is not one of",
        ),
        (
            "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\n"
            "metadata: {name: a}\nspec: {mtls: {mode: OFF}}\n",
            "document 1: PeerAuthentication default/a: spec.mtls.mode",
        ),
    ],
)
def test_a_bad_peer_authentication_refuses_the_file_naming_it(document: str, says: str) -> None:
    with pytest.raises(RegistryFileError, match=says):
        parse_registry(document, "mesh.yaml")


async def test_peer_authentications_survive_the_parser_process() -> None:
    document = (
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\n"
        "metadata: {name: default, namespace: shop}\nspec: {mtls: {mode: STRICT}}\n"
    )
    state = await parse_off_loop(document.encode(), "mesh.yaml", "Kubernetes")
    assert [(p.key.namespace, p.mode) for p in state.peer_authentications] == [
        ("shop", MtlsMode.STRICT)
    ]
