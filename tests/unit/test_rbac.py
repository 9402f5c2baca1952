"""AuthorizationPolicy as Envoy RBAC: the order, the matchers, and failing closed (pure).

What Envoy does with these is tested with real sidecars (tests/integration); here,
that each policy becomes the rules istiod would write, and that whatever cannot be
checked makes an ALLOW rule match nothing and a DENY rule deny regardless.
"""

from __future__ import annotations

from typing import Any

from envoy.config.rbac.v3 import rbac_pb2
from google.protobuf import json_format

from pilot.builders.path_matchers import TRAVERSAL
from pilot.builders.rbac import quote_meta, rbac_rules
from pilot.registry.authorization_policy import (
    AppliedPolicies,
    parse_authorization_policy,
)


def applied(*specs: dict[str, Any], uncertain: bool = False) -> AppliedPolicies:
    policies = tuple(
        parse_authorization_policy(
            {
                "apiVersion": "security.istio.io/v1",
                "kind": "AuthorizationPolicy",
                "metadata": {"name": f"p{i}", "namespace": "shop"},
                "spec": spec,
            }
        )
        for i, spec in enumerate(specs)
    )
    return AppliedPolicies(policies, uncertain)


def as_dict(rules: rbac_pb2.RBAC) -> dict[str, Any]:
    return json_format.MessageToDict(rules, preserving_proto_field_name=True)


def actions(found: list[rbac_pb2.RBAC]) -> list[str]:
    return [rbac_pb2.RBAC.Action.Name(r.action) for r in found]


def test_no_policy_no_filter() -> None:
    assert rbac_rules(AppliedPolicies(), tcp=False) == []


def test_allow_nothing_is_an_allow_filter_without_policies() -> None:
    (allow,) = rbac_rules(applied({}), tcp=False)
    assert allow.action == rbac_pb2.RBAC.ALLOW and not allow.policies
    (uncertain,) = rbac_rules(applied(uncertain=True), tcp=True)
    assert uncertain.action == rbac_pb2.RBAC.ALLOW and not uncertain.policies


def test_custom_deny_audit_allow_in_istios_order() -> None:
    found = rbac_rules(
        applied(
            {"rules": [{}]},
            {"action": "AUDIT", "rules": [{}]},
            {"action": "DENY", "rules": [{}]},
            {"action": "CUSTOM", "provider": {"name": "opa"}, "rules": [{}]},
        ),
        tcp=False,
    )
    assert actions(found) == ["DENY", "LOG", "ALLOW"]
    deny = as_dict(found[0])["policies"]
    assert set(deny) == {"ns[shop]-policy[p2]-rule[0]", "ns[shop]-policy[p3]-rule[all]"}
    assert deny["ns[shop]-policy[p3]-rule[all]"] == {
        "permissions": [{"any": True}],
        "principals": [{"any": True}],
    }


def test_principals_namespaces_and_service_accounts_match_the_peer_certificate() -> None:
    source = {
        "principals": ["cluster.local/ns/shop/sa/productpage", "*-admin", "cluster.local/*"],
        "namespaces": ["team-*"],
        "serviceAccounts": ["bookinfo"],
    }
    (allow,) = rbac_rules(applied({"rules": [{"from": [{"source": source}]}]}), tcp=False)
    principal = as_dict(allow)["policies"]["ns[shop]-policy[p0]-rule[0]"]["principals"][0]
    principals, namespaces, accounts = principal["and_ids"]["ids"]
    names = [p["authenticated"]["principal_name"] for p in principals["or_ids"]["ids"]]
    assert names == [
        {"exact": "spiffe://cluster.local/ns/shop/sa/productpage"},
        {"safe_regex": {"regex": "spiffe://.*-admin"}},
        {"prefix": "spiffe://cluster.local/"},
    ]
    assert namespaces["authenticated"]["principal_name"]["safe_regex"]["regex"] == (
        ".*/ns/team-.*/.*"
    )
    assert accounts["authenticated"]["principal_name"]["safe_regex"]["regex"] == (
        "spiffe://.+/ns/shop/(.+/|)sa/bookinfo(/.+)?"
    )


def test_regex_metacharacters_in_values_are_literals() -> None:
    assert quote_meta("a.b*c(d)|e[f]{g}^$\\+?") == r"a\.b\*c\(d\)\|e\[f\]\{g\}\^\$\\\+\?"
    (allow,) = rbac_rules(
        applied({"rules": [{"from": [{"source": {"namespaces": ["a.b|c"]}}]}]}), tcp=False
    )
    principal = as_dict(allow)["policies"]["ns[shop]-policy[p0]-rule[0]"]["principals"][0]
    assert principal["authenticated"]["principal_name"]["safe_regex"]["regex"] == (
        r".*/ns/a\.b\|c/.*"
    )


def test_http_fields_on_a_tcp_chain_fail_closed() -> None:
    rule = {"to": [{"operation": {"paths": ["/admin"], "ports": ["5432"]}}]}
    (allow,) = rbac_rules(applied({"rules": [rule]}), tcp=True)
    assert not allow.policies  # the ALLOW rule matches nothing on TCP
    (deny,) = rbac_rules(applied({"action": "DENY", "rules": [rule]}), tcp=True)
    permission = as_dict(deny)["policies"]["ns[shop]-policy[p0]-rule[0]"]["permissions"][0]
    assert permission == {"destination_port": 5432}  # denied whatever the path


def test_request_principals_fail_closed_until_jwt() -> None:
    rule = {"from": [{"source": {"requestPrincipals": ["issuer/subject"]}}]}
    (allow,) = rbac_rules(applied({"rules": [rule]}), tcp=False)
    assert not allow.policies
    (deny,) = rbac_rules(applied({"action": "DENY", "rules": [rule]}), tcp=False)
    assert as_dict(deny)["policies"]["ns[shop]-policy[p0]-rule[0]"]["principals"] == [{"any": True}]


def test_an_unknown_when_key_denies_never_allows() -> None:
    rule = {"when": [{"key": "request.auth.claims[group]", "values": ["admin"]}]}
    (allow,) = rbac_rules(applied({"rules": [rule, {}]}), tcp=False)
    assert list(allow.policies) == ["ns[shop]-policy[p0]-rule[1]"]  # only the other rule
    (deny,) = rbac_rules(applied({"action": "DENY", "rules": [rule]}), tcp=False)
    assert list(deny.policies) == ["ns[shop]-policy[p0]-rule[0]"]


def test_operations_and_conditions() -> None:
    rule = {
        "to": [
            {
                "operation": {
                    "hosts": ["Reviews.shop"],
                    "methods": ["GET"],
                    "notPaths": ["/admin*"],
                }
            }
        ],
        "when": [
            {"key": "source.ip", "values": ["10.0.0.0/8"], "notValues": ["10.1.0.0/16"]},
            {"key": "destination.port", "values": ["9080"]},
        ],
    }
    (allow,) = rbac_rules(applied({"rules": [rule]}), tcp=False)
    policy = as_dict(allow)["policies"]["ns[shop]-policy[p0]-rule[0]"]
    operation, port = policy["permissions"][0]["and_rules"]["rules"]
    host, method, paths = operation["and_rules"]["rules"]
    assert host["header"] == {
        "name": ":authority",
        "string_match": {"exact": "Reviews.shop", "ignore_case": True},
    }
    assert method["header"]["string_match"] == {"exact": "GET"}
    # An ALLOW's notPaths are widened (pilot.builders.path_matchers): /ADMIN, //admin too.
    spellings, traversal = paths["not_rule"]["or_rules"]["rules"]
    assert spellings["url_path"]["path"] == {
        "safe_regex": {"regex": r"(?i)(?:[/\\]|%2f|%5c)+admin.*"}
    }
    assert traversal["url_path"]["path"]["safe_regex"]["regex"] == TRAVERSAL
    assert port == {"destination_port": 9080}
    inside, outside = policy["principals"][0]["and_ids"]["ids"]
    assert inside["direct_remote_ip"] == {"address_prefix": "10.0.0.0", "prefix_len": 8}
    assert outside["not_id"]["direct_remote_ip"]["address_prefix"] == "10.1.0.0"


def test_a_header_wildcard_is_its_presence_and_service_accounts_split_as_istio() -> None:
    """`*` on a header matches it sent empty too (a DENY on its presence holds); `a/b/c`
    is service account `b/c` of namespace `a` (the first slash), as istiod reads it."""
    rule = {
        "from": [{"source": {"serviceAccounts": ["a/b/c"]}}],
        "when": [{"key": "request.headers[x-debug]", "values": ["*"]}],
    }
    (deny,) = rbac_rules(applied({"action": "DENY", "rules": [rule]}), tcp=False)
    principal = as_dict(deny)["policies"]["ns[shop]-policy[p0]-rule[0]"]["principals"][0]
    account, header = principal["and_ids"]["ids"]
    assert account["authenticated"]["principal_name"]["safe_regex"]["regex"] == (
        "spiffe://.+/ns/a/(.+/|)sa/b/c(/.+)?"
    )
    assert header == {"header": {"name": "x-debug", "present_match": True}}
