"""What the tests of `envoy --mode validate` on pilot's output share.

`bootstrap_of` puts what pilot served one proxy into a bootstrap: its clusters and
listeners static, each route configuration inline in a listener of its own (so that
Envoy checks every cluster a route names), and the `xds-grpc` and `sds-grpc` clusters
a sidecar's bootstrap has. `fetch` takes over delta ADS what pilot serves the sidecar
pod POD_ID at POD_IP, until its `virtualInbound` and an inbound cluster are there.
"""

from __future__ import annotations

from typing import Any

from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

from pilot.xds import types
from tests.support.xds_client import DeltaStream, delta_resources


def inline_routes(held: dict[str, dict[str, Any]]) -> list[listener_pb2.Listener]:
    """A listener per route configuration with the configuration inline (clusters checked)."""
    listeners = []
    for i, config in enumerate(held[types.ROUTE].values()):
        manager = hcm_pb2.HttpConnectionManager(stat_prefix="inline", route_config=config)
        manager.route_config.validate_clusters.value = True
        manager.http_filters.add(name="router").typed_config.Pack(router_pb2.Router())
        chain = listener_components_pb2.FilterChain()
        chain.filters.add(name="hcm").typed_config.Pack(manager)
        listeners.append(
            listener_pb2.Listener(
                name=f"inline-{config.name}",
                address=address_pb2.Address(
                    socket_address=address_pb2.SocketAddress(
                        address="127.0.0.1", port_value=40000 + i
                    )
                ),
                filter_chains=[chain],
            )
        )
    return listeners


def bootstrap_of(held: dict[str, dict[str, Any]]) -> bootstrap_pb2.Bootstrap:
    boot = bootstrap_pb2.Bootstrap(node=base_pb2.Node(id="validate", cluster="validate"))
    ads = boot.dynamic_resources.ads_config
    ads.api_type = config_source_pb2.ApiConfigSource.DELTA_GRPC
    ads.transport_api_version = config_source_pb2.V3
    ads.grpc_services.add().envoy_grpc.cluster_name = "xds-grpc"
    xds = boot.static_resources.clusters.add(name="xds-grpc")
    xds.connect_timeout.seconds = 1
    xds.load_assignment.cluster_name = "xds-grpc"
    sds = boot.static_resources.clusters.add(name="sds-grpc")  # what auto mTLS names
    sds.connect_timeout.seconds = 1
    sds.load_assignment.cluster_name = "sds-grpc"
    options = http_protocol_options_pb2.HttpProtocolOptions()
    options.explicit_http_config.http2_protocol_options.SetInParent()  # a gRPC server
    sds.typed_extension_protocol_options[
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ].Pack(options)
    boot.static_resources.clusters.extend(held[types.CLUSTER].values())
    boot.static_resources.listeners.extend(held[types.LISTENER].values())
    boot.static_resources.listeners.extend(inline_routes(held))
    return boot


POD_IP = "10.44.0.7"
POD_ID = f"sidecar~{POD_IP}~reviews-1.shop~shop.svc.cluster.local"
TIMEOUT = 30.0


async def fetch(stream: DeltaStream) -> dict[str, dict[str, Any]]:
    held: dict[str, dict[str, Any]] = {t: {} for t in (types.CLUSTER, types.LISTENER, types.ROUTE)}
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.LISTENER, ["*"])
    while not (
        "virtualInbound" in held[types.LISTENER] and "inbound|8080||" in held[types.CLUSTER]
    ):
        response = await stream.next_response(TIMEOUT)
        for name, resource in delta_resources(response).items():
            held[response.type_url][name] = resource.message
        await stream.ack(response)
    return held
