"""Envoy accepts the route configurations VirtualServices make, hostile ones included.

The registry file holds services svc0..svcN (9080, http), each with a DestinationRule
defining subsets v1..v3 and a VirtualService; what pilot serves a sidecar (clusters,
listeners, route configuration 9080) goes into a bootstrap whose listeners carry each
route configuration inline with the outbound filters (CORS, fault, router) and
`validate_clusters` on, which `envoy --mode validate` must accept. First every part of
the API as istio.io's tasks write it, then fuzzed VirtualServices (hypothesis): whatever
pilot accepts of them Envoy accepts; the rest are refused, each with a warning, and
their services keep the default route.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot.registry.istio_config import ConfigError
from pilot.registry.virtual_service import parse_virtual_service
from pilot.xds import types
from tests.integration.envoy_validation import POD_ID
from tests.integration.route_validation import fetch, host, routed_service, validate_held
from tests.integration.route_validation import validated as validated_for
from tests.support.mesh import service
from tests.support.pilot import running_pilot
from tests.support.xds_client import XdsClient, node


def objects_for(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A service, a DestinationRule (v1..v3) and the VirtualService `spec` per spec."""
    return [obj for i, spec in enumerate(specs) for obj in routed_service(i, spec)]


async def validated(tmp_path: Path, specs: list[dict[str, Any]]) -> route_pb2.RouteConfiguration:
    """Route configuration 9080 pilot serves for `specs`, after Envoy validated it."""
    return await validated_for(tmp_path, objects_for(specs), len(specs), node(POD_ID))


def dest(subset: str, weight: int | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"destination": {"host": "svc0", "subset": subset}}
    return entry if weight is None else entry | {"weight": weight}


EVERY_PART = {
    "http": [
        {
            "name": "jason",
            "match": [
                {"headers": {"end-user": {"exact": "jason"}}, "uri": {"prefix": "/api"}},
                {"uri": {"regex": "/v[0-9]+/.*"}, "method": {"exact": "GET"},
                 "queryParams": {"debug": {"exact": "1"}}, "ignoreUriCase": True},
                {"withoutHeaders": {"x-canary": {}}, "authority": {"prefix": "svc0"}},
            ],
            "route": [dest("v2")],
            "timeout": "0.5s",
            "retries": {"attempts": 3, "perTryTimeout": "2s",
                        "retryOn": "gateway-error,connect-failure,503"},
            "fault": {"delay": {"fixedDelay": "2s", "percentage": {"value": 50}},
                      "abort": {"httpStatus": 500, "percentage": {"value": 10}}},
            "headers": {"request": {"set": {"x-a": "1"}, "add": {"x-b": "2"}, "remove": ["x-c"]},
                        "response": {"set": {"x-d": "4"}, "remove": ["server"]}},
            "corsPolicy": {"allowOrigins": [{"exact": "https://a.example"},
                                            {"regex": "https://.*\\.example"}],
                           "allowMethods": ["GET"], "allowHeaders": ["x-a"],
                           "exposeHeaders": ["x-b"], "maxAge": "24h",
                           "allowCredentials": False},
            "mirror": {"host": "svc0", "subset": "v3"},
            "mirrorPercentage": {"value": 5.5},
        },
        {"match": [{"uri": {"exact": "/old"}}],
         "redirect": {"uri": "/new", "authority": "svc0", "redirectCode": 302}},
        {"match": [{"uri": {"prefix": "/rewrite"}}], "rewrite": {"uri": "/", "authority": "x"},
         "route": [dest("v1")]},
        {"match": [{"uri": {"prefix": "/re"}}],
         "rewrite": {"uriRegexRewrite": {"match": "^/re/(.*)", "rewrite": "/\\1"}},
         "route": [dest("v1")]},
        {"route": [dest("v1", 80), dest("v3", 20)], "retries": {"attempts": 0}},
    ]
}  # fmt: skip


async def test_envoy_validates_every_part_of_a_virtual_service(tmp_path: Path) -> None:
    config = await validated(tmp_path, [EVERY_PART])
    [vhost] = [h for h in config.virtual_hosts if h.name == f"{host(0)}:9080"]
    # three matches of the first route, then one route each: the order written.
    assert [r.name for r in vhost.routes] == ["jason", "jason", "jason", "", "", "", ""]
    weights = {c.name: c.weight.value for c in vhost.routes[-1].route.weighted_clusters.clusters}
    assert weights == {f"outbound|9080|v1|{host(0)}": 80, f"outbound|9080|v3|{host(0)}": 20}


# -- fuzzed VirtualServices ---------------------------------------------------------------

# Mostly what users write, now and then what no one should (each draw of a field).
_text = st.one_of(
    st.sampled_from(["a", "x-a", "/p", "v1", "svc0", "end-user", "%2F", "a.b"]),
    st.sampled_from(["", "a\r\nb", "x\x00", ":authority", "host", "Host", "a b", "é"]),
    st.text(max_size=12),
)
_regex = st.sampled_from(
    ["/v[0-9]+", "(?=x)", "(a)\\1", "a++", "(", "a{1000}{1000}", ".*", "[[:alpha:]]", "\\p{L}+"]
)
_good_match = st.one_of(
    st.fixed_dictionaries({"exact": _text}),
    st.fixed_dictionaries({"prefix": _text}),
    st.fixed_dictionaries({"regex": _regex}),
)
_string_match = st.one_of(
    _good_match, _good_match, _good_match, st.sampled_from([{}, {"exact": "a", "prefix": "b"}])
)
_headers = st.dictionaries(
    st.sampled_from(["end-user", "x-a", "X-Upper", ":method", "bad name", ""]),
    _string_match,
    max_size=2,
)
_durations = st.sampled_from(
    ["1ms", "0.5s", "2s", "0s", "10h", "1.5s", "3m"] * 3 + ["-1s", "x", 3, "99999999999s"]
)
_percent = st.fixed_dictionaries(
    {"value": st.sampled_from([0, 12.5, 50, 100, 0.0001, 99.9999] * 2 + [101, -1, "x"])}
)
_match = st.fixed_dictionaries(
    {},
    optional={
        "uri": _string_match,
        "headers": _headers,
        "withoutHeaders": _headers,
        "method": _string_match,
        "queryParams": st.dictionaries(_text, _string_match, max_size=2),
        "port": st.sampled_from([9080, 80, 0, 70000]),
        "ignoreUriCase": st.booleans(),
        "sourceLabels": st.just({"app": "productpage"}),
    },
)
_destination = st.fixed_dictionaries(
    {
        "destination": st.fixed_dictionaries(
            {"host": st.sampled_from(["svc0", "svc0.shop.svc.cluster.local"])},
            optional={"subset": st.sampled_from(["v1", "v2", "v3"] * 3 + ["BAD|x"])},
        ),
        "weight": st.integers(-1, 100),
    },
    optional={
        "headers": st.fixed_dictionaries(
            {},
            optional={
                "request": st.fixed_dictionaries(
                    {}, optional={"set": st.dictionaries(_text, _text, max_size=2)}
                )
            },
        ),
    },
)
_header_ops = st.fixed_dictionaries(
    {},
    optional={
        "set": st.dictionaries(_text, _text, max_size=2),
        "add": st.dictionaries(_text, _text, max_size=2),
        "remove": st.lists(_text, max_size=2),
    },
)
_delay = st.fixed_dictionaries({"fixedDelay": _durations}, optional={"percentage": _percent})
_abort = st.fixed_dictionaries(
    {"httpStatus": st.one_of(st.sampled_from([500, 503, 429, 404]), st.integers(0, 700))},
    optional={"percentage": _percent},
)
_route = st.fixed_dictionaries(
    {"route": st.lists(_destination, min_size=1, max_size=3)},
    optional={
        "match": st.lists(_match, max_size=3),
        "timeout": _durations,
        "retries": st.fixed_dictionaries(
            {"attempts": st.integers(-1, 2000)},
            optional={
                "perTryTimeout": _durations,
                "retryOn": st.sampled_from(["5xx", "503,gateway-error", "bogus", "", "5xx,,"]),
            },
        ),
        "fault": st.one_of(
            st.fixed_dictionaries({"delay": _delay}, optional={"abort": _abort}),
            st.fixed_dictionaries({"abort": _abort}),
        ),
        "rewrite": st.fixed_dictionaries({}, optional={"uri": _text, "authority": _text}),
        "headers": st.fixed_dictionaries(
            {}, optional={"request": _header_ops, "response": _header_ops}
        ),
        "mirror": st.fixed_dictionaries({"host": st.just("svc0"), "subset": st.just("v1")}),
        "mirrorPercentage": _percent,
        "corsPolicy": st.fixed_dictionaries(
            {},
            optional={
                "allowOrigins": st.lists(_string_match, max_size=2),
                "allowMethods": st.lists(_text, max_size=2),
                "allowHeaders": st.lists(_text, max_size=2),
                "maxAge": _durations,
            },
        ),
    },
)
_specs = st.lists(
    st.fixed_dictionaries({"http": st.lists(_route, min_size=1, max_size=3)}),
    min_size=1,
    max_size=12,
)


def accepted(specs: list[dict[str, Any]]) -> set[str]:
    """The hosts whose VirtualService pilot's parser accepts."""
    hosts = set()
    for i, obj in enumerate(o for o in objects_for(specs) if o["kind"] == "VirtualService"):
        try:
            parse_virtual_service(obj, "cluster.local")
        except ConfigError:
            continue
        hosts.add(host(i))
    return hosts


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(specs=_specs)
def test_envoy_validates_fuzzed_virtual_services(tmp_path_factory: Any, specs: list[Any]) -> None:
    """What pilot accepts, Envoy accepts; a refused one leaves its host the default route."""
    tmp_path = tmp_path_factory.mktemp("fuzz")
    config = asyncio.run(validated(tmp_path, specs))
    good = accepted(specs)
    for vhost in config.virtual_hosts:
        name = vhost.name.removesuffix(":9080")
        if name.startswith("svc") and name not in good:
            assert [r.name for r in vhost.routes] == ["default"], vhost
        elif name.startswith("svc"):  # its VirtualService's routes (none: all left out)
            assert all(r.name != "default" for r in vhost.routes), vhost


async def test_envoy_validates_a_tcp_route_shifting_weights(tmp_path: Path) -> None:
    """istio.io's TCP traffic shifting (tcp-echo, 80/20 over v1 and v2): the TCP proxy's
    weighted clusters, in a listener Envoy accepts."""
    echo = service("tcp-echo", "shop", [("tcp", 9000)])
    echo["spec"]["clusterIP"] = "10.96.7.7"
    subsets = [{"name": v, "labels": {"version": v}} for v in ("v1", "v2")]

    def to(subset: str, weight: int) -> dict[str, Any]:
        return {"destination": {"host": "tcp-echo", "subset": subset}, "weight": weight}

    objects = [
        *objects_for([EVERY_PART]),
        echo,
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "tcp-echo", "namespace": "shop"},
            "spec": {"host": "tcp-echo", "subsets": subsets},
        },
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "tcp-echo", "namespace": "shop"},
            "spec": {
                "hosts": ["tcp-echo"],
                "tcp": [{"match": [{"port": 9000}], "route": [to("v1", 80), to("v2", 20)]}],
            },
        },
    ]
    async with (
        running_pilot(tmp_path, objects) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        held = await fetch(client.delta_ads(node(POD_ID)), 1)
    listener: listener_pb2.Listener = held[types.LISTENER]["10.96.7.7_9000"]
    proxy = tcp_proxy_pb2.TcpProxy()
    assert listener.filter_chains[0].filters[0].typed_config.Unpack(proxy)
    echo_host = "tcp-echo.shop.svc.cluster.local"
    assert [(c.name, c.weight) for c in proxy.weighted_clusters.clusters] == [
        (f"outbound|9000|v1|{echo_host}", 80),
        (f"outbound|9000|v2|{echo_host}", 20),
    ]
    validate_held(tmp_path, held)
