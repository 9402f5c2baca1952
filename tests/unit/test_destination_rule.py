"""DestinationRule parsing: Istio's YAML as istio.io's tasks write it, merged per port and
subset as Istio merges it, and hostile objects refused with one line naming them."""

from __future__ import annotations

from typing import Any

import pytest

from pilot.registry.destination_rule import (
    ConnectionPool,
    LoadBalancer,
    parse_destination_rule,
    policy_for,
)
from pilot.registry.istio_config import ConfigError

DOMAIN = "cluster.local"


def rule(spec: dict[str, Any], name: str = "reviews", namespace: str = "default") -> Any:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def refused(obj: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_destination_rule(obj, DOMAIN)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 600
    return message


def test_bookinfo_subsets_as_istio_io_writes_them() -> None:
    parsed = parse_destination_rule(
        rule(
            {
                "host": "reviews",
                "subsets": [
                    {"name": "v1", "labels": {"version": "v1"}},
                    {"name": "v2", "labels": {"version": "v2"}},
                ],
            }
        ),
        DOMAIN,
    )
    assert parsed.host == "reviews.default.svc.cluster.local"
    assert [s.name for s in parsed.subsets] == ["v1", "v2"]
    assert parsed.subsets[1].selects({"version": "v2", "app": "reviews"})
    assert not parsed.subsets[1].selects({"version": "v1"})
    assert parsed.export_to == ("*",)


@pytest.mark.parametrize("version", ["v1", "v1beta1", "v1alpha3"])
def test_every_networking_version_is_read(version: str) -> None:
    obj = rule({"host": "reviews.other.svc.cluster.local"})
    obj["apiVersion"] = f"networking.istio.io/{version}"
    assert parse_destination_rule(obj, DOMAIN).host == "reviews.other.svc.cluster.local"


def test_port_level_settings_replace_the_rule_and_subsets_override_field_by_field() -> None:
    parsed = parse_destination_rule(
        rule(
            {
                "host": "reviews",
                "trafficPolicy": {
                    "loadBalancer": {"simple": "RANDOM"},
                    "connectionPool": {"tcp": {"maxConnections": 5}},
                    "portLevelSettings": [
                        {"port": {"number": 9080}, "loadBalancer": {"simple": "ROUND_ROBIN"}}
                    ],
                },
                "subsets": [
                    {
                        "name": "v2",
                        "labels": {"version": "v2"},
                        "trafficPolicy": {"connectionPool": {"http": {"maxRetries": 2}}},
                    }
                ],
            }
        ),
        DOMAIN,
    )
    # Port 9080: the port-level entry replaces all four (the pool is gone).
    assert policy_for(parsed, 9080).load_balancer == LoadBalancer("ROUND_ROBIN")
    assert policy_for(parsed, 9080).connection_pool is None
    # Another port: the rule's; the subset overrides the pool only.
    other = policy_for(parsed, 80, "v2")
    assert other.load_balancer == LoadBalancer("RANDOM")
    assert other.connection_pool == ConnectionPool(max_retries=2)


def test_consistent_hash_and_outlier_detection() -> None:
    parsed = parse_destination_rule(
        rule(
            {
                "host": "reviews",
                "trafficPolicy": {
                    "loadBalancer": {"consistentHash": {"httpCookie": {"name": "u", "ttl": "0s"}}},
                    "outlierDetection": {"consecutiveErrors": 3, "interval": "1s"},
                },
            }
        ),
        DOMAIN,
    )
    policy = policy_for(parsed, 9080)
    assert policy.load_balancer is not None and policy.load_balancer.consistent_hash is not None
    assert policy.load_balancer.consistent_hash.cookie == "u"
    assert policy.outlier_detection is not None
    assert policy.outlier_detection.consecutive_5xx_errors == 3  # the deprecated name
    assert policy.outlier_detection.interval == 1.0


def test_tls_pilot_cannot_build_is_kept_to_fail_closed() -> None:
    parsed = parse_destination_rule(
        rule({"host": "db", "trafficPolicy": {"tls": {"mode": "SIMPLE", "credentialName": "c"}}}),
        DOMAIN,
    )
    tls = policy_for(parsed, 5432).tls
    assert tls is not None and tls.unsupported == "credentialName"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"host": "r", "subsets": [{"name": "v1"}] * 2}, "'v1' is given twice"),
        ({"host": "r", "subsets": [{"name": "a|b"}]}, "spec.subsets[0].name"),
        ({"host": "r", "color": "blue"}, "unknown field 'color'"),
        ({"host": "r", "trafficPolicy": {"loadBalancer": {"simple": "FAST"}}}, "FAST"),
        ({"host": "r", "trafficPolicy": {"tunnel": {}}}, "not supported by pilot"),
        ({"host": "r", "workloadSelector": {}}, "workloadSelector"),
        (
            {"host": "r", "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": -1}}}},
            "maxConnections -1",
        ),
        ({"host": "r", "trafficPolicy": {"outlierDetection": {"interval": "1x"}}}, "interval"),
        ({"host": "r\nx"}, "control characters"),
        ({"host": "a" * 300}, "spec.host"),
        ({"host": "r", "subsets": [{"name": f"s{i}"} for i in range(5000)]}, "5000 entries"),
        ({"host": "r", "exportTo": ["../etc"]}, "exportTo[0]"),
        ({}, "spec.host"),
    ],
)
def test_hostile_rules_are_refused_naming_the_object_and_field(spec: Any, says: str) -> None:
    message = refused(rule(spec))
    assert message.startswith("DestinationRule default/reviews: ")
    assert says in message


def test_a_name_with_a_newline_is_escaped_in_the_message() -> None:
    message = refused(rule({"host": 5}, name="evil\nINFO forged"))
    assert "\n" not in message and "evil\\nINFO forged" in message


def test_a_wrong_api_version_is_refused() -> None:
    obj = rule({"host": "r"})
    obj["apiVersion"] = "networking.istio.io/v2"
    assert "apiVersion" in refused(obj)


def test_a_ca_file_on_the_proxy_fails_closed() -> None:
    """Envoy would read it itself: a missing file would make every sidecar reject CDS."""
    parsed = parse_destination_rule(
        rule(
            {
                "host": "db",
                "trafficPolicy": {"tls": {"mode": "SIMPLE", "caCertificates": "/no/such.pem"}},
            }
        ),
        DOMAIN,
    )
    tls = policy_for(parsed, 5432).tls
    assert tls is not None and tls.unsupported == "caCertificates"
