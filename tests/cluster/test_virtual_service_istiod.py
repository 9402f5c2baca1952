"""pilot's routes for a VirtualService are istiod's, field for field.

The same API server, the same Service, Pod, DestinationRule and VirtualService
(through the CRDs): istiod (tools/istiod/build) and pilot each serve one sidecar of
the namespace, and every route of the service's virtual host in route configuration
80 says the same in both: its match (uri exact, prefix and regex, ignoreUriCase,
headers, withoutHeaders, queryParams, method, authority), and what it does (subset
destinations and weights, timeout, retries, fault abort and delay, rewrite of uri
and authority, redirect, headers set, added and removed on requests and responses,
mirror with its percentage, CORS).

What is left out of the comparison, with why:
- `name` and `decorator`: istiod names routes `NAME.NAMESPACE` or by index and adds
  a decorator for tracing; pilot names them for its own proxy-config.
- `metadata`: istiod marks each route with the VirtualService it came from (for
  its own tooling); Envoy does nothing with it.
- the virtual host's domains (docs/sidecar.md: pilot lists `host:PORT` forms where
  istiod sets ignore_port_in_host_matching).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2

from pilot.xds import types
from tests.cluster.control_plane import ControlPlane
from tests.cluster.istiod_server import resources_of, side_by_side
from tests.cluster.workloads import (
    SERVICE_PORT,
)

SUBSETS = [{"name": v, "labels": {"app": "reviews"}} for v in ("v1", "v2", "v3")]


def _to(subset: str, weight: int | None = None) -> dict[str, Any]:
    destination: dict[str, Any] = {"destination": {"host": "reviews", "subset": subset}}
    return destination | ({"weight": weight} if weight is not None else {})


HTTP = [
    {
        "name": "jason",
        "match": [{"headers": {"end-user": {"exact": "jason"}}, "uri": {"prefix": "/api"}}],
        "route": [_to("v2")],
        "timeout": "0.5s",
        "retries": {"attempts": 3, "perTryTimeout": "2s", "retryOn": "connect-failure,503"},
        "headers": {
            "request": {"set": {"x-set": "a"}, "add": {"x-add": "b"}, "remove": ["x-gone"]},
            "response": {"set": {"x-out": "c"}, "remove": ["server"]},
        },
    },
    {
        "match": [
            {"uri": {"regex": "/items/[0-9]+"}, "method": {"exact": "GET"}},
            {"uri": {"exact": "/Case"}, "ignoreUriCase": True},
        ],
        "fault": {
            "abort": {"percentage": {"value": 10.0}, "httpStatus": 503},
            "delay": {"percentage": {"value": 50.0}, "fixedDelay": "2s"},
        },
        "route": [_to("v1", 80), _to("v3", 20)],
    },
    {
        "match": [{"queryParams": {"debug": {"exact": "1"}}, "withoutHeaders": {"x-skip": {}}}],
        "rewrite": {"uri": "/v2/", "authority": "reviews-v2"},
        "mirror": {"host": "reviews", "subset": "v3"},
        "mirrorPercentage": {"value": 25.0},
        "route": [_to("v2")],
    },
    {
        "match": [{"uri": {"prefix": "/old"}}],
        "redirect": {"uri": "/new", "authority": "elsewhere", "redirectCode": 308},
    },
    {
        "match": [{"authority": {"prefix": "reviews"}}],
        "corsPolicy": {
            "allowOrigins": [{"exact": "https://example.com"}],
            "allowMethods": ["GET", "POST"],
            "allowHeaders": ["x-a"],
            "exposeHeaders": ["x-b"],
            "maxAge": "24h",
            "allowCredentials": True,
        },
        "route": [_to("v1")],
    },
    {"route": [_to("v1")]},
]
# What each route says; `name`, `decorator` and `metadata` are the servers' own (above).
COMPARED = (
    "match",
    "route",
    "redirect",
    "typed_per_filter_config",
    "request_headers_to_add",
    "request_headers_to_remove",
    "response_headers_to_add",
    "response_headers_to_remove",
)


FILTER_CONFIGS = {
    "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault": fault_pb2.HTTPFault,
    "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy": cors_pb2.CorsPolicy,
}


def _filter_configs(route: route_components_pb2.Route) -> str:
    """The per-route filter configs, decoded: Go and upb order a message's fields apart."""
    decoded = {}
    for name, packed in sorted(route.typed_per_filter_config.items()):
        message = FILTER_CONFIGS[packed.type_url]()
        packed.Unpack(message)
        decoded[name] = str(message)
    return str(decoded)


def _said(route: route_components_pb2.Route) -> dict[str, str]:
    said = {f: str(getattr(route, f)) for f in COMPARED}
    return said | {"typed_per_filter_config": _filter_configs(route)}


def _routes_of(config: route_pb2.RouteConfiguration, host: str) -> list[dict[str, str]]:
    [virtual_host] = [h for h in config.virtual_hosts if host in h.domains]
    return [_said(route) for route in virtual_host.routes]


async def test_pilots_routes_for_a_virtual_service_are_istiods(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    host = f"reviews.{namespace}.svc.cluster.local"
    route = str(SERVICE_PORT)
    objects = [
        ("DestinationRule", {"host": "reviews", "subsets": SUBSETS}),
        ("VirtualService", {"hosts": ["reviews"], "http": HTTP}),
    ]
    async with side_by_side(deployed, namespace, tmp_path, "reviews", objects) as both:
        configs = {
            k: (await resources_of(t, both.node_id, types.ROUTE, [route], {route}))[route]
            for k, t in both.servers.items()
        }
    ours, theirs = (_routes_of(configs[k], host) for k in configs)
    assert len(ours) == len(HTTP) + 1  # the ignoreUriCase match is a route of its own
    for i, (mine, istiods) in enumerate(zip(ours, theirs, strict=True)):
        for field in COMPARED:
            assert mine[field] == istiods[field], (i, field)
