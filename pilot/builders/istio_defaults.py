"""What Istio does with no traffic config at all: its default retries and load balancing.

Istio (its `route/retry` DefaultPolicy and its cluster builder, as the release
pinned in tools/istiod sends them) puts on every outbound HTTP route a retry
policy of 2 retries on `connect-failure,refused-stream,unavailable,cancelled,
retriable-status-codes`, with no status codes listed (so an upstream's 503 is
passed on, not retried: `retriable-status-codes` only matches codes a policy or
the client's `x-envoy-retriable-status-codes` names), the `previous_hosts`
predicate so a retry goes to another endpoint, and at most 5 host selections
for it; its outbound virtual hosts tell the app which attempt a request is
(`include_request_attempt_count`: the `x-envoy-attempt-count` header). Inbound
HTTP routes (to the app on the pod) retry twice on `reset-before-request`
only, and not on gRPC ports, where streams would be replayed. Outbound
clusters balance LEAST_REQUEST with an empty `common_lb_config`. Every
service cluster, inbound cluster and passthrough cluster lifts Envoy's
circuit breakers (1,024 connections, pending and active requests, 3
concurrent retries) to the largest value: Envoy's 3 retries would turn the
default retries into 503s as soon as a few endpoints go at once (a rolling
update), which is why Istio lifts them.

The messages are built once here and copied into each route and cluster, so the
defaults cost nothing per request and nothing per push beyond what the
resources already cost.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from google.protobuf import any_pb2, wrappers_pb2

DEFAULT_RETRIES = 2
DEFAULT_RETRY_ON = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
HOST_SELECTION_RETRY_MAX_ATTEMPTS = 5
PREVIOUS_HOSTS = "envoy.retry_host_predicates.previous_hosts"
INBOUND_RETRY_ON = "reset-before-request"
DEFAULT_LB_POLICY = cluster_pb2.Cluster.LEAST_REQUEST
UNLIMITED = 2**32 - 1  # Istio's circuit breaker thresholds with no DestinationRule


def _previous_hosts() -> rc_pb2.RetryPolicy.RetryHostPredicate:
    packed = any_pb2.Any()
    packed.Pack(previous_hosts_pb2.PreviousHostsPredicate())
    return rc_pb2.RetryPolicy.RetryHostPredicate(name=PREVIOUS_HOSTS, typed_config=packed)


def outbound_retry_policy() -> rc_pb2.RetryPolicy:
    """Istio's default retry policy of an outbound route (a fresh copy to put in a route)."""
    return rc_pb2.RetryPolicy(
        retry_on=DEFAULT_RETRY_ON,
        num_retries=wrappers_pb2.UInt32Value(value=DEFAULT_RETRIES),
        retry_host_predicate=[_previous_hosts()],
        host_selection_retry_max_attempts=HOST_SELECTION_RETRY_MAX_ATTEMPTS,
    )


def inbound_retry_policy() -> rc_pb2.RetryPolicy:
    """Istio's retry policy of an inbound route to a non-gRPC app port: a request the app's
    connection reset before it was sent is sent again, nothing else."""
    return rc_pb2.RetryPolicy(
        retry_on=INBOUND_RETRY_ON,
        num_retries=wrappers_pb2.UInt32Value(value=DEFAULT_RETRIES),
    )


def lift_circuit_breakers(cluster: cluster_pb2.Cluster) -> cluster_pb2.Cluster:
    """`cluster` with Istio's default thresholds (the default priority's, all unlimited)."""
    thresholds = cluster.circuit_breakers.thresholds.add()
    thresholds.max_connections.value = UNLIMITED
    thresholds.max_pending_requests.value = UNLIMITED
    thresholds.max_requests.value = UNLIMITED
    thresholds.max_retries.value = UNLIMITED
    return cluster


def apply_outbound_defaults(cluster: cluster_pb2.Cluster) -> cluster_pb2.Cluster:
    """`cluster` balanced and bounded as Istio's service clusters are with no
    DestinationRule."""
    cluster.lb_policy = DEFAULT_LB_POLICY
    cluster.common_lb_config.SetInParent()
    return lift_circuit_breakers(cluster)
