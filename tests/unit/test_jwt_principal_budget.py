"""What one AuthorizationPolicy's JWT values can cost the translation: split against many
long issuers, a policy past the budget fails closed (its ALLOW rule matches nothing, its
DENY rule denies regardless) instead of holding the event loop; under it, it translates."""

from __future__ import annotations

import time

from pilot.builders.rbac import MAX_JWT_WORK, rbac_rules
from pilot.registry.authorization_policy import AppliedPolicies, parse_authorization_policy

ISSUERS = tuple(f"{'a' * 1000}{i}" for i in range(64))  # long, alike: a suffix splits often
VALUES = [f"*{'a' * 1000}/s{i}" for i in range(1024)]


def _policy(action: str, values: list[str]) -> AppliedPolicies:
    rule = {"from": [{"source": {"requestPrincipals": values}}]}
    obj = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "big", "namespace": "shop"},
        "spec": {"action": action, "rules": [rule]},
    }
    return AppliedPolicies((parse_authorization_policy(obj),))


def test_a_policy_past_the_budget_fails_closed_at_once() -> None:
    assert len(ISSUERS) * len(VALUES) * len(VALUES[0]) > MAX_JWT_WORK
    started = time.process_time()
    (allow,) = rbac_rules(_policy("ALLOW", VALUES), tcp=False, issuers=ISSUERS)
    (deny,) = rbac_rules(_policy("DENY", VALUES), tcp=False, issuers=ISSUERS)
    spent = time.process_time() - started
    print(f"two policies past the budget translated in {spent * 1000:.0f} ms of CPU")
    assert allow.action == allow.ALLOW and not allow.policies  # matches nothing
    (denying,) = deny.policies.values()
    assert denying.principals[0].any, "the DENY rule denies regardless of the principal"


def test_under_the_budget_it_translates() -> None:
    (allow,) = rbac_rules(_policy("ALLOW", VALUES[:2]), tcp=False, issuers=ISSUERS[:2])
    assert "sourced_metadata" in str(allow)
