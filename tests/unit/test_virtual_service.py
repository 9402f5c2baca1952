"""VirtualService parsing: istio.io's task YAML read whole; regexes Envoy's RE2 refuses
(even where Python's `re` compiles them) and hostile objects refused, naming them."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pilot.registry.istio_config import ConfigError
from pilot.registry.virtual_service import Destination, StringMatch, parse_virtual_service

DOMAIN = "cluster.local"


def virtual_service(spec: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    return {
        "apiVersion": f"networking.istio.io/{version}",
        "kind": "VirtualService",
        "metadata": {"name": "reviews", "namespace": "default"},
        "spec": spec,
    }


def refused(spec: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_virtual_service(virtual_service(spec), DOMAIN)
    message = str(caught.value)
    assert message.startswith("VirtualService default/reviews: ") and "\n" not in message
    return message


def test_request_routing_for_jason_as_istio_io_writes_it() -> None:
    parsed = parse_virtual_service(
        virtual_service(
            {
                "hosts": ["reviews"],
                "http": [
                    {
                        "match": [{"headers": {"end-user": {"exact": "jason"}}}],
                        "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
                    },
                    {"route": [{"destination": {"host": "reviews", "subset": "v1"}}]},
                ],
            },
            "v1alpha3",
        ),
        DOMAIN,
    )
    assert parsed.hosts == ("reviews.default.svc.cluster.local",)
    assert parsed.for_mesh
    first, second = parsed.http
    assert first.matches[0].headers == (("end-user", StringMatch("exact", "jason")),)
    assert first.route[0].destination == Destination("reviews.default.svc.cluster.local", "v2")
    assert not second.matches


def test_shifting_faults_timeouts_retries_and_tcp_routes() -> None:
    parsed = parse_virtual_service(
        virtual_service(
            {
                "hosts": ["reviews.default.svc.cluster.local"],
                "http": [
                    {
                        "fault": {"delay": {"percentage": {"value": 100.0}, "fixedDelay": "2s"}},
                        "timeout": "0.5s",
                        "retries": {"attempts": 3, "perTryTimeout": "2s", "retryOn": "5xx,503"},
                        "route": [
                            {"destination": {"host": "reviews", "subset": "v1"}, "weight": 80},
                            {"destination": {"host": "reviews", "subset": "v3"}, "weight": 20},
                        ],
                    }
                ],
                "tcp": [{"route": [{"destination": {"host": "db", "port": {"number": 27017}}}]}],
            }
        ),
        DOMAIN,
    )
    route = parsed.http[0]
    assert [d.weight for d in route.route] == [80, 20]
    assert route.timeout == 0.5 and route.fault is not None and route.fault.delay == 2.0
    assert route.retries is not None and route.retries.retry_on == ("5xx", "503")
    assert parsed.tcp[0].route[0].destination.port == 27017


@pytest.mark.parametrize(
    "pattern",
    [
        "(?=lookahead)",  # lookaround
        r"(a)\1",  # a backreference
        "a++",  # a possessive quantifier
        "a{1000}",  # compiles in RE2, too large for Envoy's program size limit
        "x" * 5000,  # longer than any regex pilot takes
    ],
)
def test_a_regex_envoys_re2_refuses_is_refused(pattern: str) -> None:
    if pattern != "a++":
        re.compile(pattern)  # Python's `re` takes all but one of them
    spec = {
        "hosts": ["reviews"],
        "http": [
            {"match": [{"uri": {"regex": pattern}}], "route": [{"destination": {"host": "r"}}]}
        ],
    }
    assert "spec.http[0].match[0].uri.regex" in refused(spec)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"hosts": []}, "spec.hosts is empty"),
        ({"hosts": ["r"], "http": [{"route": []}]}, "must give one of route, redirect"),
        ({"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}}] * 2}]}, "no weight"),
        ({"hosts": ["r"], "tls": []}, "not supported by pilot"),
        (
            {
                "hosts": ["r"],
                "http": [
                    {
                        "route": [{"destination": {"host": "r"}}],
                        "corsPolicy": {"unmatchedPreflights": "SOMETIMES"},
                    }
                ],
            },
            "spec.http[0].corsPolicy.unmatchedPreflights",
        ),
        (
            {
                "hosts": ["r"],
                "http": [
                    {
                        "route": [{"destination": {"host": "r"}}],
                        "retries": {"attempts": 1, "retryOn": "sometimes"},
                    }
                ],
            },
            "'sometimes' is not a retry policy",
        ),
        (
            {
                "hosts": ["r"],
                "http": [
                    {
                        "match": [{"headers": {"End-User": {"exact": "j"}}}],
                        "route": [{"destination": {"host": "r"}}],
                    }
                ],
            },
            "lower-case header name",
        ),
        (
            {"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}}]}] * 300},
            "300 entries",
        ),
        (
            {
                "hosts": ["r"],
                "http": [{"route": [{"destination": {"host": "r", "subset": "v\n1"}}]}],
            },
            "control characters",
        ),
        (
            {
                "hosts": ["r"],
                "http": [
                    {
                        "route": [{"destination": {"host": "r"}}],
                        "fault": {"abort": {"httpStatus": 700}},
                    }
                ],
            },
            "httpStatus 700",
        ),
        ({"hosts": ["r"], "bogus": 1}, "unknown field 'bogus'"),
        (  # a Duration protobuf holds, but Envoy refuses past int64 nanoseconds
            {
                "hosts": ["r"],
                "http": [{"route": [{"destination": {"host": "r"}}], "timeout": "99999999999s"}],
            },
            "spec.http[0].timeout is longer than a Duration can be",
        ),
    ],
)
def test_hostile_services_are_refused(spec: dict[str, Any], says: str) -> None:
    assert says in refused(spec)


def test_lists_of_lists_are_bounded_in_all() -> None:
    """Each list is within its bound, but their product is not: refused, not parsed."""
    match = [{"headers": {f"h{i}": {"exact": "x"} for i in range(100)}}] * 100
    route = {"match": match, "route": [{"destination": {"host": "r"}}]}
    assert "too large" in refused({"hosts": ["r"], "http": [route] * 200})


def test_regexes_are_bounded_per_object() -> None:
    match = [{"uri": {"regex": f"/{i}.*"}} for i in range(300)]
    spec = {"hosts": ["r"], "http": [{"match": match, "route": [{"destination": {"host": "r"}}]}]}
    assert "one regex too many" in refused(spec)
