"""A DestinationRule's traffic policy on a cluster, as istiod writes it.

`apply_policy(cluster, policy)` changes a built cluster (`pilot.builders.cds`) by the
policy one port (or subset) gets (`pilot.registry.destination_rule.policy_for`):

- loadBalancer: simple ROUND_ROBIN, LEAST_REQUEST (and LEAST_CONN, its old name),
  RANDOM; PASSTHROUGH makes an ORIGINAL_DST cluster (CLUSTER_PROVIDED, no EDS);
  consistentHash a RING_HASH cluster with its minimum ring size (the route's hash
  policy, what is hashed, is the routes' to build).
- connectionPool: circuit_breakers' one threshold, Istio's defaults (every maximum
  2^32-1) with what the rule gives (tcp maxConnections; http
  http1MaxPendingRequests, http2MaxRequests, maxRetries); tcp connectTimeout is the
  cluster's connect_timeout; http idleTimeout and maxRequestsPerConnection go into
  the upstream HttpProtocolOptions' common options.
- outlierDetection: consecutive 5xx and gateway errors each enforced at 100% when
  given above 0 (0% at 0), success-rate ejection off, interval, baseEjectionTime,
  maxEjectionPercent, and minHealthPercent as the healthy panic threshold.
- loadBalancer.localityLbSetting: locality-weighted balancing where the rule weights
  localities (`pilot.builders.locality_lb`; the weights and priorities themselves
  are the assignments').

TLS (only the sidecars' clusters carry it, as auto mTLS): DISABLE is plaintext,
SIMPLE `simple_tls`, ISTIO_MUTUAL the mTLS socket auto mTLS uses (the rule's sni
and subjectAltNames where it gives them), and what pilot cannot build (MUTUAL, a
credentialName) `fail_closed`: the cluster has no endpoint, so nothing is sent
in plaintext where TLS was written.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.matcher.v3 import string_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import duration_pb2, wrappers_pb2

from pilot.builders.cds import HTTP_OPTIONS_KEY
from pilot.builders.istio_defaults import UNLIMITED
from pilot.builders.locality_lb import apply_locality_rule, locality_rule
from pilot.builders.mtls import TLS_SOCKET
from pilot.registry.destination_rule import (
    ClientTls,
    ConnectionPool,
    LoadBalancer,
    OutlierDetection,
    PortPolicy,
)

_SIMPLE = {
    "ROUND_ROBIN": cluster_pb2.Cluster.ROUND_ROBIN,
    "LEAST_REQUEST": cluster_pb2.Cluster.LEAST_REQUEST,
    "LEAST_CONN": cluster_pb2.Cluster.LEAST_REQUEST,
    "RANDOM": cluster_pb2.Cluster.RANDOM,
}


def duration(seconds: float) -> duration_pb2.Duration:
    whole = int(seconds)
    return duration_pb2.Duration(seconds=whole, nanos=round((seconds - whole) * 1e9))


def apply_policy(cluster: cluster_pb2.Cluster, policy: PortPolicy) -> None:
    """Change `cluster` by the load balancer, connection pool, outlier detection and
    locality load balancing."""
    if policy.load_balancer is not None:
        _load_balancer(cluster, policy.load_balancer)
    if policy.connection_pool is not None:
        _connection_pool(cluster, policy.connection_pool)
    if policy.outlier_detection is not None:
        _outlier_detection(cluster, policy.outlier_detection)
    if cluster.type != cluster_pb2.Cluster.ORIGINAL_DST:  # no endpoints of pilot's to weigh
        apply_locality_rule(cluster, locality_rule(policy))


def _load_balancer(cluster: cluster_pb2.Cluster, lb: LoadBalancer) -> None:
    if lb.consistent_hash is not None:
        cluster.lb_policy = cluster_pb2.Cluster.RING_HASH
        ring = cluster.ring_hash_lb_config
        ring.minimum_ring_size.value = lb.consistent_hash.minimum_ring_size
        return
    if lb.simple == "PASSTHROUGH":
        cluster.ClearField("eds_cluster_config")
        cluster.type = cluster_pb2.Cluster.ORIGINAL_DST
        cluster.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
        return
    if lb.simple in _SIMPLE:
        cluster.lb_policy = _SIMPLE[lb.simple]


def _connection_pool(cluster: cluster_pb2.Cluster, pool: ConnectionPool) -> None:
    threshold = circuit_breaker_pb2.CircuitBreakers.Thresholds(
        max_connections=wrappers_pb2.UInt32Value(value=pool.max_connections or UNLIMITED),
        max_pending_requests=wrappers_pb2.UInt32Value(
            value=pool.http1_max_pending_requests or UNLIMITED
        ),
        max_requests=wrappers_pb2.UInt32Value(value=pool.http2_max_requests or UNLIMITED),
        max_retries=wrappers_pb2.UInt32Value(value=pool.max_retries or UNLIMITED),
    )
    cluster.circuit_breakers.CopyFrom(circuit_breaker_pb2.CircuitBreakers(thresholds=[threshold]))
    if pool.connect_timeout is not None:
        cluster.connect_timeout.CopyFrom(duration(pool.connect_timeout))
    if pool.idle_timeout is not None or pool.max_requests_per_connection:
        _common_http_options(cluster, pool)


def _common_http_options(cluster: cluster_pb2.Cluster, pool: ConnectionPool) -> None:
    """idleTimeout and maxRequestsPerConnection, in the cluster's HttpProtocolOptions (its
    HTTP/2 settings kept; HTTP/1.1 explicit where it had none)."""
    options = http_protocol_options_pb2.HttpProtocolOptions()
    held = cluster.typed_extension_protocol_options
    if HTTP_OPTIONS_KEY in held:
        held[HTTP_OPTIONS_KEY].Unpack(options)
    else:
        options.explicit_http_config.http_protocol_options.SetInParent()
    common: base_pb2.HttpProtocolOptions = options.common_http_protocol_options
    if pool.idle_timeout is not None:
        common.idle_timeout.CopyFrom(duration(pool.idle_timeout))
    if pool.max_requests_per_connection:
        common.max_requests_per_connection.value = pool.max_requests_per_connection
    held[HTTP_OPTIONS_KEY].Pack(options)


def _outlier_detection(cluster: cluster_pb2.Cluster, outlier: OutlierDetection) -> None:
    detection = outlier_detection_pb2.OutlierDetection(
        enforcing_success_rate=wrappers_pb2.UInt32Value(value=0)
    )
    if outlier.consecutive_5xx_errors is not None:
        value = outlier.consecutive_5xx_errors
        detection.consecutive_5xx.value = value
        detection.enforcing_consecutive_5xx.value = 100 if value > 0 else 0
    if outlier.consecutive_gateway_errors is not None:
        value = outlier.consecutive_gateway_errors
        detection.consecutive_gateway_failure.value = value
        detection.enforcing_consecutive_gateway_failure.value = 100 if value > 0 else 0
    if outlier.interval is not None:
        detection.interval.CopyFrom(duration(outlier.interval))
    if outlier.base_ejection_time is not None:
        detection.base_ejection_time.CopyFrom(duration(outlier.base_ejection_time))
    if outlier.max_ejection_percent is not None:
        detection.max_ejection_percent.value = outlier.max_ejection_percent
    cluster.outlier_detection.CopyFrom(detection)
    cluster.common_lb_config.healthy_panic_threshold.CopyFrom(
        percent_pb2.Percent(value=float(outlier.min_health_percent))
    )


SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"  # Istio's default trust for SIMPLE TLS


def fail_closed(cluster: cluster_pb2.Cluster) -> None:
    """A cluster whose TLS pilot cannot build: no endpoint at all (Envoy answers 503)
    rather than plaintext where TLS was written."""
    cluster.ClearField("eds_cluster_config")
    cluster.ClearField("transport_socket_matches")
    cluster.type = cluster_pb2.Cluster.STATIC
    cluster.load_assignment.cluster_name = cluster.name


def simple_tls(tls: ClientTls) -> tls_pb2.UpstreamTlsContext:
    """SIMPLE: TLS to the server, verified against the system's CAs and the rule's
    subjectAltNames, unless insecureSkipVerify (a rule naming a CA file fails closed
    before this)."""
    context = tls_pb2.UpstreamTlsContext(sni=tls.sni)
    if tls.insecure_skip_verify:
        return context
    validation = context.common_tls_context.validation_context
    validation.trusted_ca.filename = SYSTEM_CA
    for name in tls.subject_alt_names:
        kind = (
            common_pb2.SubjectAltNameMatcher.URI
            if "://" in name
            else (common_pb2.SubjectAltNameMatcher.DNS)
        )
        validation.match_typed_subject_alt_names.add(
            san_type=kind, matcher=string_pb2.StringMatcher(exact=name)
        )
    return context


def set_transport_socket(cluster: cluster_pb2.Cluster, context: tls_pb2.UpstreamTlsContext) -> None:
    cluster.ClearField("transport_socket_matches")
    cluster.transport_socket.name = TLS_SOCKET
    cluster.transport_socket.typed_config.Pack(context)
