"""`localityLbSetting` read as Istio validates it, in a rule's policy, its port-level
settings and its subsets; hostile ones refused with one line naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from pilot.builders.locality_lb import FLAT, LocalityRule, locality_rule
from pilot.registry.destination_rule import parse_destination_rule, policy_for
from pilot.registry.istio_config import ConfigError
from pilot.registry.locality_lb import MAX_LOCALITY_ENTRIES, Distribute, LocalityLbSetting

DOMAIN = "cluster.local"
OUTLIERS = {"outlierDetection": {"consecutive5xxErrors": 1}}


def rule(setting: Any, **policy: Any) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "reviews", "namespace": "default"},
        "spec": {
            "host": "reviews",
            "trafficPolicy": {"loadBalancer": {"localityLbSetting": setting}, **policy},
        },
    }


def setting(value: Any) -> LocalityLbSetting | None:
    lb = policy_for(parse_destination_rule(rule(value), DOMAIN), 9080).load_balancer
    assert lb is not None
    return lb.locality


def refused(value: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_destination_rule(rule(value), DOMAIN)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, "one short line"
    assert "DestinationRule default/reviews" in message
    return message


def test_istio_io_distribute_and_failover_examples() -> None:
    west = {"us-west/zone1/*": 80, "us-west/zone2/*": 20}
    assert setting({"distribute": [{"from": "us-west/zone1/*", "to": west}]}) == LocalityLbSetting(
        distribute=(Distribute("us-west/zone1/*", tuple(sorted(west.items()))),)
    )
    assert setting({"failover": [{"from": "us-east", "to": "eu-west"}]}) == LocalityLbSetting(
        failover=(("us-east", "eu-west"),)
    )
    assert setting({"enabled": False}) == LocalityLbSetting(enabled=False)
    assert setting({}) == LocalityLbSetting()


def test_a_catch_all_after_specific_sources_is_allowed_as_istio_allows_it() -> None:
    found = setting(
        {"distribute": [{"from": "eu/a", "to": {"eu/a": 100}}, {"from": "*", "to": {"eu": 100}}]}
    )
    assert found is not None and [d.source for d in found.distribute] == ["eu/a", "*"]


def test_what_the_cluster_follows_istios_rule() -> None:
    def follows(value: Any, **policy: Any) -> LocalityRule:
        parsed = parse_destination_rule(rule(value, **policy), DOMAIN)
        return locality_rule(policy_for(parsed, 9080))

    assert follows({}) == FLAT, "no outlier detection: no failover"
    assert follows({}, **OUTLIERS) == LocalityRule(failover=True)
    assert follows({"enabled": False}, **OUTLIERS) == FLAT
    moved = follows({"failover": [{"from": "us", "to": "eu"}]}, **OUTLIERS)
    assert moved.failover_to == (("us", "eu"),) and moved.weighted
    weights = follows({"distribute": [{"from": "*", "to": {"eu": 100}}]})
    assert weights.distribute and weights.weighted and not weights.failover


def test_port_level_settings_and_subsets_carry_their_own() -> None:
    obj = rule({"enabled": False}, **OUTLIERS)
    obj["spec"]["trafficPolicy"]["portLevelSettings"] = [
        {"port": {"number": 9080}, "outlierDetection": {"consecutive5xxErrors": 2}}
    ]
    obj["spec"]["subsets"] = [
        {
            "name": "v1",
            "labels": {"version": "v1"},
            "trafficPolicy": {
                "loadBalancer": {"localityLbSetting": {"failover": [{"from": "us", "to": "eu"}]}}
            },
        },
    ]
    parsed = parse_destination_rule(obj, DOMAIN)
    assert locality_rule(policy_for(parsed, 80)) == FLAT, "the rule's own: enabled false"
    # The port's settings replace the whole policy: the mesh default, with its outliers.
    assert locality_rule(policy_for(parsed, 9080)) == LocalityRule(failover=True)
    assert locality_rule(policy_for(parsed, 80, "v1")).failover_to == (("us", "eu"),)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({"distribute": [{"from": "*", "to": {"eu": 60, "us": 30}}]}, "sum to 90, not 100"),
        ({"distribute": [{"from": "*", "to": {"eu": 0, "us": 100}}]}, "0 is not in 1..100"),
        ({"distribute": [{"from": "*", "to": {"eu": 101}}]}, "101 is not in 1..100"),
        ({"distribute": [{"from": "*", "to": {"eu": "x"}}]}, "must be an integer"),
        ({"distribute": [{"from": "*", "to": {}}]}, "non-empty mapping"),
        ({"distribute": [{"from": "*"}]}, "non-empty mapping"),
        (
            {
                "distribute": [{"from": "*", "to": {"eu": 100}}],
                "failover": [{"from": "us", "to": "eu"}],
            },
            "both distribute and failover",
        ),
        ({"distribute": [{"from": "*/a", "to": {"eu": 100}}]}, "only come once, at the end"),
        ({"distribute": [{"from": "eu/*/*", "to": {"eu": 100}}]}, "only come once"),
        ({"distribute": [{"from": "eu*", "to": {"eu": 100}}]}, "whole region"),
        ({"distribute": [{"from": "eu//a", "to": {"eu": 100}}]}, "empty region"),
        ({"distribute": [{"from": "", "to": {"eu": 100}}]}, "empty region"),
        ({"distribute": [{"from": "eu/a/rack1", "to": {"eu": 100}}]}, "names a sub-zone"),
        ({"distribute": [{"from": "eu", "to": {"eu": 50, "eu/a": 50}}]}, "overlaps"),
        ({"distribute": [{"from": "*", "to": {"*": 50, "eu/a": 50}}]}, "overlaps"),
        (
            {
                "distribute": [
                    {"from": "eu", "to": {"eu": 100}},
                    {"from": "eu/a", "to": {"eu": 100}},
                ]
            },
            "overlaps",
        ),
        (
            {"distribute": [{"from": "*", "to": {"eu": 100}}, {"from": "eu", "to": {"eu": 100}}]},
            "overlaps",
        ),
        ({"failover": [{"from": "us", "to": "us"}]}, "two different regions"),
        ({"failover": [{"from": "us/a", "to": "eu"}]}, "must be a region"),
        ({"failover": [{"from": "us", "to": "*"}]}, "must be a region"),
        ({"failover": [{"from": "us"}]}, "must be a string"),
        ({"failoverPriority": ["topology.istio.io/network"]}, "failoverPriority is not supported"),
        ({"enabled": "yes"}, "true or false"),
        ({"weights": 1}, "unknown field"),
        ("all", "must be a mapping"),
        ({"distribute": [{"from": "eu\nus", "to": {"eu": 100}}]}, "control characters"),
        ({"distribute": [{"from": "eu\x00", "to": {"eu": 100}}]}, "control characters"),
        ({"distribute": [{"from": "*", "to": {"eu\n": 100}}]}, "control characters"),
        ({"distribute": [{"from": "e" * 5000, "to": {"eu": 100}}]}, "at most 253"),
    ],
)
def test_hostile_settings_are_refused_naming_the_field(value: Any, said: str) -> None:
    assert said in refused(value)


def test_huge_lists_are_refused_before_they_are_walked() -> None:
    many = [{"from": f"r{i}", "to": {"eu": 100}} for i in range(MAX_LOCALITY_ENTRIES + 1)]
    assert f"at most {MAX_LOCALITY_ENTRIES}" in refused({"distribute": many})
    wide = {f"r{i}": 1 for i in range(100_000)}
    assert f"at most {MAX_LOCALITY_ENTRIES}" in refused({"distribute": [{"from": "*", "to": wide}]})
    far = [{"from": f"r{i}", "to": "eu"} for i in range(MAX_LOCALITY_ENTRIES + 1)]
    assert f"at most {MAX_LOCALITY_ENTRIES}" in refused({"failover": far})
