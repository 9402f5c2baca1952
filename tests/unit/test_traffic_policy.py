"""A DestinationRule's policy on a built cluster, as istiod writes it, and read back in
`pilot proxy-config clusters`' POLICY cell."""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

from pilot.builders.cds import HTTP_OPTIONS_KEY, build_cluster
from pilot.builders.istio_defaults import UNLIMITED
from pilot.builders.traffic_policy import apply_policy, fail_closed
from pilot.debug.cluster_policy import cluster_policy
from pilot.registry.destination_rule import parse_destination_rule, policy_for
from pilot.registry.model import ServicePort
from pilot.xds.flavor import Flavor


def built(policy: dict[str, Any], port: ServicePort | None = None) -> cluster_pb2.Cluster:
    rule = parse_destination_rule(
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "r", "namespace": "default"},
            "spec": {"host": "reviews", "trafficPolicy": policy},
        },
        "cluster.local",
    )
    port = port or ServicePort("http", 9080)
    cluster = build_cluster("outbound|9080||reviews", port, Flavor.ADS, "xds-grpc")
    apply_policy(cluster, policy_for(rule, port.port))
    return cluster


def test_circuit_breakers_keep_istios_unlimited_defaults_where_the_rule_says_nothing() -> None:
    cluster = built(
        {"connectionPool": {"tcp": {"maxConnections": 1}, "http": {"http1MaxPendingRequests": 1}}}
    )
    [threshold] = cluster.circuit_breakers.thresholds
    assert (threshold.max_connections.value, threshold.max_pending_requests.value) == (1, 1)
    assert threshold.max_requests.value == threshold.max_retries.value == UNLIMITED
    assert "maxConnections=1; maxPending=1" in cluster_policy(cluster)


def test_http_options_keep_http2_and_add_the_per_connection_limits() -> None:
    cluster = built(
        {"connectionPool": {"http": {"maxRequestsPerConnection": 1, "idleTimeout": "90s"}}},
        ServicePort("grpc", 9080),
    )
    options = http_protocol_options_pb2.HttpProtocolOptions()
    cluster.typed_extension_protocol_options[HTTP_OPTIONS_KEY].Unpack(options)
    assert options.explicit_http_config.HasField("http2_protocol_options")
    assert options.common_http_protocol_options.max_requests_per_connection.value == 1
    assert options.common_http_protocol_options.idle_timeout.seconds == 90


def test_outlier_detection_as_istiod_maps_it() -> None:
    cluster = built(
        {
            "outlierDetection": {
                "consecutive5xxErrors": 0,
                "consecutiveGatewayErrors": 5,
                "interval": "10s",
                "baseEjectionTime": "30s",
            }
        }
    )
    detection = cluster.outlier_detection
    assert detection.enforcing_success_rate.value == 0
    assert (detection.consecutive_5xx.value, detection.enforcing_consecutive_5xx.value) == (0, 0)
    assert detection.enforcing_consecutive_gateway_failure.value == 100
    assert cluster.common_lb_config.healthy_panic_threshold.value == 0  # minHealthPercent 0
    assert "outlier(5xx=0, gateway=5, every 10s, eject 30s)" in cluster_policy(cluster)


def test_passthrough_and_ring_hash() -> None:
    passthrough = built({"loadBalancer": {"simple": "PASSTHROUGH"}})
    assert passthrough.type == cluster_pb2.Cluster.ORIGINAL_DST
    assert not passthrough.HasField("eds_cluster_config")
    ring = built({"loadBalancer": {"consistentHash": {"useSourceIp": True}}})
    assert ring.lb_policy == cluster_pb2.Cluster.RING_HASH
    assert "ring>=1024" in cluster_policy(ring)


def test_failing_closed_leaves_no_endpoint_and_no_plaintext() -> None:
    cluster = built({})
    fail_closed(cluster)
    assert cluster.type == cluster_pb2.Cluster.STATIC
    assert not cluster.load_assignment.endpoints and not cluster.transport_socket_matches
