"""Route configuration 9080 made by VirtualServices, read from pilot and validated by Envoy.

What the VirtualService and client-route validation tests share: services svc0..svcN
(9080, http) with a DestinationRule defining subsets v1..v3 and a VirtualService each;
reading clusters, listeners and route configuration 9080 off a sidecar's stream; and a
bootstrap carrying that route configuration inline, behind the filters pilot's outbound
chains carry, with `validate_clusters` on, which `envoy --mode validate` must accept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from pilot.builders.listeners import route_filters, router_filter
from pilot.xds import types
from tests.integration.envoy_validation import bootstrap_of
from tests.support.envoy_process import validate_bootstrap
from tests.support.mesh import service
from tests.support.pilot import running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources

TIMEOUT = 30.0
ROUTE = "9080"
SUBSETS = ("v1", "v2", "v3")


def host(i: int) -> str:
    return f"svc{i}.shop.svc.cluster.local"


def routed_service(
    i: int, spec: dict[str, Any], namespace: str = "shop", vs_host: str = ""
) -> list[dict[str, Any]]:
    """Service svcI of shop, its DestinationRule (v1..v3) and a VirtualService for it
    written in `namespace`, naming it `vs_host` (its short name when not given)."""
    subsets = [{"name": v, "labels": {"version": v}} for v in SUBSETS]
    return [
        service(f"svc{i}", "shop", [("http", 9080)]),
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": f"svc{i}", "namespace": "shop"},
            "spec": {"host": f"svc{i}", "subsets": subsets},
        },
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": f"svc{i}", "namespace": namespace},
            "spec": {"hosts": [vs_host or f"svc{i}"], **spec},
        },
    ]


async def fetch(stream: DeltaStream, hosts: int) -> dict[str, dict[str, Any]]:
    """Clusters, listeners and route configuration 9080, once every subset cluster is in."""
    held: dict[str, dict[str, Any]] = {t: {} for t in (types.CLUSTER, types.LISTENER, types.ROUTE)}
    wanted = {f"outbound|9080|{v}|{host(i)}" for i in range(hosts) for v in SUBSETS}
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.LISTENER, ["*"])
    await stream.subscribe(types.ROUTE, [ROUTE])
    while not (wanted <= held[types.CLUSTER].keys() and ROUTE in held[types.ROUTE]):
        response = await stream.next_response(TIMEOUT)
        for name, resource in delta_resources(response).items():
            held[response.type_url][name] = resource.message
        await stream.ack(response)
    return held


def inline_listener(config: route_pb2.RouteConfiguration) -> listener_pb2.Listener:
    """The route configuration inline, behind the filters pilot's outbound chains carry."""
    manager = hcm_pb2.HttpConnectionManager(
        stat_prefix="inline", route_config=config, http_filters=[*route_filters(), router_filter()]
    )
    manager.route_config.validate_clusters.value = True
    chain = listener_components_pb2.FilterChain()
    chain.filters.add(name="hcm").typed_config.Pack(manager)
    address = address_pb2.SocketAddress(address="127.0.0.1", port_value=41000)
    return listener_pb2.Listener(
        name="inline-routes",
        address=address_pb2.Address(socket_address=address),
        filter_chains=[chain],
    )


def validate_held(tmp_path: Path, held: dict[str, dict[str, Any]]) -> route_pb2.RouteConfiguration:
    """Envoy validates what was read, route configuration 9080 inline; returns it."""
    routes = dict(held[types.ROUTE])
    held[types.ROUTE] = {}
    bootstrap = bootstrap_of(held)
    bootstrap.static_resources.listeners.append(inline_listener(routes[ROUTE]))
    path = tmp_path / "bootstrap.pb"
    path.write_bytes(bootstrap.SerializeToString())
    validate_bootstrap(path)
    config: route_pb2.RouteConfiguration = routes[ROUTE]
    return config


async def validated(
    tmp_path: Path, objects: list[Any], hosts: int, sidecar: base_pb2.Node
) -> route_pb2.RouteConfiguration:
    """Route configuration 9080 as `sidecar` reads it from a pilot serving `objects` (with
    svc0..svc{hosts-1}), after Envoy validated it."""
    async with (
        running_pilot(tmp_path, objects) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        held = await fetch(client.delta_ads(sidecar), hosts)
    return validate_held(tmp_path, held)
