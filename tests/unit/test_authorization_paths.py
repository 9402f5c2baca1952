"""AuthorizationPolicy paths read as Istio's validation reads them: path templates
(`{*}`, `{**}`) checked, a bound on their characters, and what fails closed said (pure).
How they become Envoy matchers: tests/unit/test_path_matchers.py."""

from __future__ import annotations

from typing import Any

import pytest

from pilot.builders.rbac import rbac_rules
from pilot.registry.authorization_policy import (
    MAX_PATH_CHARACTERS,
    AppliedPolicies,
    ConfigError,
    parse_authorization_policy,
    refused_policy,
)


def policy(action: str, field: str, *paths: str) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "paths", "namespace": "shop"},
        "spec": {"action": action, "rules": [{"to": [{"operation": {field: list(paths)}}]}]},
    }


@pytest.mark.parametrize(
    "path",
    [
        "/users/{*}/secret",
        "/files/{**}",
        "/{*}",
        "/{**}",
        "/a/{*}/{*}/b",
        "/v1/{*}/x-y_z~.!$&'()+,;:@=",
        "/{**}/a",  # a literal after {**}: Istio checks only that no operator follows it
    ],
)
@pytest.mark.parametrize("field", ["paths", "notPaths"])
def test_istios_valid_templates_are_read_and_translated(path: str, field: str) -> None:
    parsed = parse_authorization_policy(policy("ALLOW", field, path))
    assert not parsed.fail_closed and not parsed.deny_all
    (allow,) = rbac_rules(AppliedPolicies((parsed,)), tcp=False)
    assert list(allow.policies) == ["ns[shop]-policy[paths]-rule[0]"]  # the rule stands


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/{", "beyond a path template"),
        ("/a}", "beyond a path template"),
        ("/{x}", "beyond a path template"),
        ("/a{*}", "beyond a path template"),
        ("/{***}", "beyond a path template"),
        ("/{**}/{*}", "{**} is not the last operator"),
        ("/{**}/{**}", "{**} is not the last operator"),
        ("/a b/{*}", "pchar"),
        ("/a*/{*}", "pchar"),
        ("/a//{*}", "pchar"),  # an empty segment, as Istio's check
        ("/a\\b/{*}", "pchar"),
    ],
)
def test_invalid_templates_make_the_object_invalid_in_one_line(path: str, why: str) -> None:
    obj = policy("DENY", "paths", path)
    with pytest.raises(ConfigError) as refused:
        parse_authorization_policy(obj)
    line = str(refused.value)
    assert why in line and "spec.rules[0].to[0].operation.paths[0]" in line and "\n" not in line
    stand_in = refused_policy(obj, refused.value)  # what pilot enforces instead: deny all
    assert stand_in is not None and stand_in.deny_all


def test_regex_metacharacters_outside_templates_are_plain_paths() -> None:
    parsed = parse_authorization_policy(policy("DENY", "paths", "/a.*+?()[]^$|\\", "*.php"))
    assert not parsed.fail_closed


def test_the_characters_of_a_policys_paths_are_bounded() -> None:
    paths = ["/" + "a" * 1000] * (MAX_PATH_CHARACTERS // 1001 + 1)
    with pytest.raises(ConfigError) as refused:
        parse_authorization_policy(policy("DENY", "paths", *paths))
    assert f"at most {MAX_PATH_CHARACTERS}" in str(refused.value)


def test_an_exact_template_too_long_for_envoy_fails_closed_and_says_so() -> None:
    long = "/" + "a" * 300 + "/{*}"
    allow = parse_authorization_policy(policy("ALLOW", "paths", long))
    assert len(allow.fail_closed) == 1 and "too long for Envoy's RE2" in allow.fail_closed[0]
    assert "matches nothing" in allow.fail_closed[0]
    (rules,) = rbac_rules(AppliedPolicies((allow,)), tcp=False)
    assert not rules.policies  # the ALLOW rule matches nothing
    # A DENY widens it instead (cut into pieces): nothing fails closed, the rule stands.
    deny = parse_authorization_policy(policy("DENY", "paths", long))
    assert not deny.fail_closed
    (rules,) = rbac_rules(AppliedPolicies((deny,)), tcp=False)
    assert list(rules.policies) == ["ns[shop]-policy[paths]-rule[0]"]


@pytest.mark.parametrize(
    "paths",
    [["/deny\x00"], ["/deny\nx"], ["/deny\r"], ["/" + "a" * 100_000], ["/p"] * 1025],
    ids=["nul", "newline", "carriage-return", "100k-characters", "1025-entries"],
)
def test_hostile_paths_make_the_object_invalid_never_ignored(paths: list[str]) -> None:
    """Refused in one line; what stands in denies every request to the namespace."""
    for action in ("ALLOW", "DENY"):
        obj = policy(action, "paths", *paths)
        with pytest.raises(ConfigError) as refused:
            parse_authorization_policy(obj)
        assert "\n" not in str(refused.value) and len(str(refused.value)) < 1000
        stand_in = refused_policy(obj, refused.value)
        assert stand_in is not None and stand_in.deny_all


def test_a_thousand_paths_are_read() -> None:
    paths = [f"/api/{i}/{{*}}" for i in range(1024)]
    parsed = parse_authorization_policy(policy("DENY", "paths", *paths))
    assert not parsed.deny_all and not parsed.fail_closed


@pytest.mark.parametrize(
    ("action", "field", "widened"),
    [
        ("DENY", "paths", True),
        ("AUDIT", "paths", True),  # AUDIT as DENY
        ("ALLOW", "notPaths", True),
        ("ALLOW", "paths", False),
        ("DENY", "notPaths", False),
        ("AUDIT", "notPaths", False),
    ],
)
def test_paths_are_widened_where_matching_more_denies_more(
    action: str, field: str, widened: bool
) -> None:
    parsed = parse_authorization_policy(policy(action, field, "/admin"))
    (rules,) = rbac_rules(AppliedPolicies((parsed,)), tcp=False)
    text = str(rules.policies["ns[shop]-policy[paths]-rule[0]"])
    assert ("(?i)" in text) is widened, text
    assert ('exact: "/admin"' in text) is not widened, text
