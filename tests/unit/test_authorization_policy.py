"""AuthorizationPolicy read strictly, its scopes, and what fails closed (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from pilot.registry.authorization_policy import (
    Action,
    AuthorizationPolicies,
    ConfigError,
    parse_authorization_policy,
    refused_policy,
)


def policy(
    name: str, spec: dict[str, Any] | None, namespace: str = "shop", version: str = "v1"
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": f"security.istio.io/{version}",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": namespace},
    }
    if spec is not None:
        obj["spec"] = spec
    return obj


FULL = {
    "action": "ALLOW",
    "selector": {"matchLabels": {"app": "reviews"}},
    "rules": [
        {
            "from": [
                {
                    "source": {
                        "principals": ["cluster.local/ns/shop/sa/productpage"],
                        "notNamespaces": ["evil"],
                        "ipBlocks": ["10.0.0.0/8"],
                    }
                }
            ],
            "to": [{"operation": {"methods": ["GET"], "paths": ["/info*"], "ports": ["9080"]}}],
            "when": [{"key": "request.headers[x-id]", "values": ["a"]}],
        }
    ],
}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_every_documented_field_is_read(version: str) -> None:
    parsed = parse_authorization_policy(policy("p", FULL, version=version))
    assert parsed.action is Action.ALLOW
    assert parsed.selector == (("app", "reviews"),)
    (rule,) = parsed.rules
    assert rule.sources is not None and rule.operations is not None
    assert dict(rule.sources[0].fields)["principals"] == ("cluster.local/ns/shop/sa/productpage",)
    assert dict(rule.operations[0].fields)["paths"] == ("/info*",)
    assert rule.conditions[0].key == "request.headers[x-id]"
    assert not parsed.deny_all and not parsed.fail_closed


def test_spec_empty_is_an_allow_policy_without_rules() -> None:
    parsed = parse_authorization_policy(policy("allow-nothing", {}))
    assert parsed.action is Action.ALLOW and parsed.rules == ()


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"action": "PERMIT"}, "spec.action"),
        ({"rules": [{"from": [{"source": {"principal": ["x"]}}]}]}, "unknown field 'principal'"),
        ({"rules": [{"to": [{"operation": {"ports": ["http"]}}]}]}, "ports[0]"),
        ({"rules": [{"to": [{"operation": {"ports": ["70000"]}}]}]}, "ports[0]"),
        ({"rules": [{"from": [{"source": {"ipBlocks": ["10.0.0.300"]}}]}]}, "ipBlocks[0]"),
        ({"rules": [{"from": [{"source": {"principals": ["a\nb"]}}]}]}, "control characters"),
        ({"rules": [{"from": [{"source": {"principals": ["a\x00b"]}}]}]}, "control characters"),
        ({"rules": [{"when": [{"key": "source.ip"}]}]}, "values or notValues"),
        ({"rules": [{"when": [{"key": "source.ip", "values": ["*"]}]}]}, "not an IP"),
        ({"rules": [{"when": [{"key": "destination.port", "values": ["x"]}]}]}, "integer"),
        ({"rules": [{"from": [{"source": {"principals": ["x"] * 1025}}]}]}, "at most 1024"),
        ({"rules": [{}] * 513}, "at most 512"),
        (
            {"rules": [{"from": [{"source": {"principals": ["p"] * 1024}}]}] * 17},
            "values in all (at most 16384)",
        ),
        ({"provider": {"name": "ext"}}, "only for action CUSTOM"),
        ({"selector": {"matchLabels": {"app": 7}}}, "matchLabels"),
    ],
)
def test_what_is_not_istios_api_is_refused_in_one_line(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_authorization_policy(policy("bad", spec))
    message = str(raised.value)
    assert field in message and "AuthorizationPolicy shop/bad" in message
    assert "\n" not in message and "\x00" not in message


def test_a_refused_policy_stands_in_as_deny_everything_for_its_namespace() -> None:
    obj = policy("bad", {"action": "PERMIT"})
    with pytest.raises(ConfigError) as raised:
        parse_authorization_policy(obj)
    stand_in = refused_policy(obj, raised.value)
    assert stand_in is not None
    assert stand_in.deny_all and stand_in.selector == () and stand_in.namespace == "shop"
    assert refused_policy({"kind": "AuthorizationPolicy"}, raised.value) is None


def test_target_refs_and_custom_deny_everything_with_a_reason() -> None:
    targeted = parse_authorization_policy(
        policy("t", {"targetRefs": [{"kind": "Gateway", "name": "gw"}], "rules": [{}]})
    )
    assert targeted.deny_all and targeted.action is Action.DENY and targeted.selector == ()
    custom = parse_authorization_policy(
        policy("c", {"action": "CUSTOM", "provider": {"name": "opa"}, "rules": [{}]})
    )
    assert custom.deny_all and custom.fail_closed


def test_unchecked_conditions_are_said() -> None:
    """Request principals and request.auth claims are checked now (on the JWT payload,
    where a RequestAuthentication applies), path templates too; a request.auth key
    Istio has not still fails closed and is said."""
    parsed = parse_authorization_policy(
        policy(
            "jwt",
            {
                "rules": [
                    {
                        "from": [{"source": {"requestPrincipals": ["*"]}}],
                        "to": [{"operation": {"paths": ["/a/{*}"]}}],
                        "when": [
                            {"key": "request.auth.claims[iss]", "values": ["x"]},
                            {"key": "request.auth.unknown", "values": ["x"]},
                        ],
                    }
                ]
            },
        )
    )
    assert not parsed.deny_all
    assert len(parsed.fail_closed) == 1
    assert all("matches nothing" in reason for reason in parsed.fail_closed)
    assert not any("claims" in r or "requestPrincipals" in r for r in parsed.fail_closed)


def _store(*specs: tuple[str, str, dict[str, Any]]) -> AuthorizationPolicies:
    store = AuthorizationPolicies()
    for namespace, name, spec in specs:
        store.upsert(parse_authorization_policy(policy(name, spec, namespace)))
    return store


def names(store: AuthorizationPolicies, namespace: str, *labels: dict[str, str]) -> list[str]:
    return [p.name for p in store.policies_for(namespace, list(labels)).policies]


def test_scopes_mesh_namespace_and_workload() -> None:
    store = _store(
        ("istio-system", "mesh", {"action": "DENY", "rules": [{}]}),
        ("istio-system", "mesh-selects", {"selector": {"matchLabels": {"app": "reviews"}}}),
        ("shop", "namespace", {}),
        ("shop", "workload", {"selector": {"matchLabels": {"app": "reviews"}}}),
        ("other", "elsewhere", {}),
    )
    assert names(store, "shop", {"app": "reviews"}) == [
        "mesh",
        "mesh-selects",
        "namespace",
        "workload",
    ]
    assert names(store, "shop", {"app": "ratings"}) == ["mesh", "namespace"]
    assert names(store, "quiet", {}) == ["mesh"]


def test_an_unknown_pod_gets_every_deny_and_no_selected_allow() -> None:
    store = _store(
        ("shop", "deny-selected", {"action": "DENY", "selector": {"matchLabels": {"a": "b"}}}),
        ("shop", "allow-selected", {"selector": {"matchLabels": {"a": "b"}}}),
    )
    applied = store.policies_for("shop", [])
    assert [p.name for p in applied.policies] == ["deny-selected"]
    assert applied.allow_uncertain  # no wide ALLOW to fall back on: it allows nothing
    wide = _store(
        ("shop", "allow-selected", {"selector": {"matchLabels": {"a": "b"}}}),
        ("shop", "allow-wide", {"rules": [{}]}),
    )
    applied = wide.policies_for("shop", [{"a": "b"}, {"a": "c"}])  # two Pods at one IP
    assert [p.name for p in applied.policies] == ["allow-wide"] and not applied.allow_uncertain


def test_changes_name_the_namespaces_to_reconsider() -> None:
    store = AuthorizationPolicies()
    first = parse_authorization_policy(policy("p", {}, "shop"))
    assert store.upsert(first) == {"shop"}
    assert store.upsert(first) == frozenset()
    assert store.replace_all([first, parse_authorization_policy(policy("q", {}, "x"))]) == {"x"}
    assert store.delete(first.key) == {"shop"}
    assert store.delete(first.key) == frozenset()
