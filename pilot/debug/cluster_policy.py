"""A cluster's traffic policy in one line, as `pilot proxy-config clusters` shows it.

What a DestinationRule changes in a cluster beside its LB policy (a column of its own),
read back from the cluster itself: a ring hash's size (`ring>=N`), circuit breakers (only the
limits that are not Istio's unlimited default), connect timeout, per-connection
request limit and idle timeout, outlier detection and the healthy panic threshold,
its TLS (`tls=auto` for auto mTLS's socket matches, `tls=TLS` for one socket), and
`locality-weighted` where it balances by its localities' weights (a localityLbSetting).
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import duration_pb2

from pilot.builders.cds import HTTP_OPTIONS_KEY
from pilot.builders.istio_defaults import UNLIMITED


def _seconds(duration: duration_pb2.Duration) -> str:
    return f"{duration.seconds + duration.nanos / 1e9:g}s"


def _limits(cluster: cluster_pb2.Cluster) -> list[str]:
    parts = []
    for threshold in cluster.circuit_breakers.thresholds:
        for field, label in (
            ("max_connections", "maxConnections"),
            ("max_pending_requests", "maxPending"),
            ("max_requests", "maxRequests"),
            ("max_retries", "maxRetries"),
        ):
            if threshold.HasField(field) and getattr(threshold, field).value != UNLIMITED:
                parts.append(f"{label}={getattr(threshold, field).value}")
    return parts


def _http_options(cluster: cluster_pb2.Cluster) -> list[str]:
    if HTTP_OPTIONS_KEY not in cluster.typed_extension_protocol_options:
        return []
    options = http_protocol_options_pb2.HttpProtocolOptions()
    if not cluster.typed_extension_protocol_options[HTTP_OPTIONS_KEY].Unpack(options):
        return []
    common = options.common_http_protocol_options
    parts = []
    if common.HasField("max_requests_per_connection"):
        parts.append(f"maxRequestsPerConnection={common.max_requests_per_connection.value}")
    if common.HasField("idle_timeout"):
        parts.append(f"idleTimeout={_seconds(common.idle_timeout)}")
    return parts


def _outlier(cluster: cluster_pb2.Cluster) -> list[str]:
    if not cluster.HasField("outlier_detection"):
        return []
    detection = cluster.outlier_detection
    parts = []
    if detection.HasField("consecutive_5xx"):
        parts.append(f"5xx={detection.consecutive_5xx.value}")
    if detection.HasField("consecutive_gateway_failure"):
        parts.append(f"gateway={detection.consecutive_gateway_failure.value}")
    if detection.HasField("interval"):
        parts.append(f"every {_seconds(detection.interval)}")
    if detection.HasField("base_ejection_time"):
        parts.append(f"eject {_seconds(detection.base_ejection_time)}")
    if detection.HasField("max_ejection_percent"):
        parts.append(f"max {detection.max_ejection_percent.value}%")
    shown = ["outlier(" + ", ".join(parts) + ")"]
    if cluster.common_lb_config.HasField("healthy_panic_threshold"):
        shown.append(f"panic<{cluster.common_lb_config.healthy_panic_threshold.value:g}%")
    return shown


def _tls(cluster: cluster_pb2.Cluster) -> list[str]:
    if cluster.transport_socket_matches:
        return ["tls=auto"]
    if cluster.HasField("transport_socket"):
        return ["tls=" + cluster.transport_socket.name.rsplit(".", 1)[-1].upper()]
    return []


def cluster_policy(cluster: cluster_pb2.Cluster) -> str:
    """The policy parts of `cluster`, `; `-separated."""
    parts = []
    if cluster.HasField("ring_hash_lb_config"):
        parts.append(f"ring>={cluster.ring_hash_lb_config.minimum_ring_size.value}")
    if cluster.HasField("connect_timeout"):
        parts.append(f"connect={_seconds(cluster.connect_timeout)}")
    parts += _limits(cluster) + _http_options(cluster) + _outlier(cluster) + _tls(cluster)
    if cluster.common_lb_config.HasField("locality_weighted_lb_config"):
        parts.append("locality-weighted")
    return "; ".join(parts)
