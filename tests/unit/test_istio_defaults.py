"""Istio's defaults with no traffic config, in what the generators serve.

What a user's Envoy shows under Istio with no VirtualService or DestinationRule,
read from the resources pilot's real generators put in the cache: every service
route retries twice on Istio's conditions and moves to another host; the
fallback (`allow_any`, `block_all`) routes do not retry; every virtual host
sends the attempt count; outbound clusters balance LEAST_REQUEST; every cluster
but the blackhole has Istio's unlimited circuit breakers; the inbound route to
the app retries only a request the app reset before it was sent, and not on a
gRPC port.
"""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2

from pilot.builders.outbound import OutboundSettings, TrafficPolicy
from pilot.builders.settings import BuildSettings
from pilot.generators.rds import RouteGenerator
from pilot.push.request import PushRequest, RequestSink
from pilot.registry.index import EndpointIndex
from pilot.registry.updater import IndexUpdater
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.interception import Interception
from tests.unit.inbound_mesh import ADS, endpoints, listener, mesh, sidecar, svc

ISTIO_RETRY_ON = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
REVIEWS_CLUSTER = "outbound|9080||reviews.shop.svc.cluster.local"


def _route_configs(policy: TrafficPolicy, mode: Interception) -> dict[str, rc_pb2.VirtualHost]:
    """Virtual hosts by name of route configuration 9080, with reviews and ratings on it."""
    index, cache, stats = EndpointIndex(), ResourceCache(), XdsStats()
    pending: list[PushRequest] = []
    updater = IndexUpdater(index, RequestSink(pending.append), stats)
    routes = RouteGenerator(index, cache, OutboundSettings(policy), BuildSettings(), stats)
    updater.upsert_service(svc("reviews", ("http", 9080)))
    updater.upsert_service(svc("ratings", ("http-api", 9080)))
    request = PushRequest()
    for waiting in pending:
        request = request.merge(waiting)
    routes.build(request)
    resource = cache.get(types.ROUTE, "9080", flavor=mode.value)
    assert resource is not None, "no route configuration 9080"
    config = route_pb2.RouteConfiguration.FromString(resource.payload)
    return {host.name: host for host in config.virtual_hosts}


@pytest.mark.parametrize("mode", list(Interception))
def test_every_service_route_retries_as_istio_and_moves_to_another_host(
    mode: Interception,
) -> None:
    hosts = _route_configs(TrafficPolicy.ALLOW_ANY, mode)
    services = [host for name, host in hosts.items() if name.endswith(":9080")]
    assert len(services) == 2, sorted(hosts)
    for host in services:
        [route] = host.routes
        policy = route.route.retry_policy
        assert policy.retry_on == ISTIO_RETRY_ON, host.name
        assert policy.num_retries.value == 2, host.name
        assert list(policy.retriable_status_codes) == [], "Istio lists no status codes"
        assert policy.host_selection_retry_max_attempts == 5
        [predicate] = policy.retry_host_predicate
        assert predicate.name == "envoy.retry_host_predicates.previous_hosts"
        assert predicate.typed_config.Is(previous_hosts_pb2.PreviousHostsPredicate.DESCRIPTOR)
        assert not policy.HasField("per_try_timeout"), "Istio sets no per-try timeout"
    assert all(host.include_request_attempt_count for host in hosts.values()), (
        "every virtual host sends the app x-envoy-attempt-count, as Istio's"
    )


@pytest.mark.parametrize("policy", list(TrafficPolicy))
def test_the_fallback_routes_do_not_retry(policy: TrafficPolicy) -> None:
    hosts = _route_configs(policy, Interception.REDIRECT)
    fallback = hosts["allow_any" if policy is TrafficPolicy.ALLOW_ANY else "block_all"]
    [route] = fallback.routes
    assert not route.route.HasField("retry_policy")


def _clusters(held: dict[str, bytes]) -> dict[str, cluster_pb2.Cluster]:
    return {name: cluster_pb2.Cluster.FromString(payload) for name, payload in held.items()}


def test_outbound_clusters_balance_least_request_and_the_rest_keep_their_own() -> None:
    with mesh() as m:
        m.updater.upsert_service(svc("reviews", ("http", 9080), ("grpc-api", 9090)))
        m.updater.upsert_endpoints(endpoints("reviews", ["10.1.0.1"], ("http", 9080)))
        m.flush()
        clusters = _clusters(m.connect(sidecar("10.1.0.1"), ADS).held["cds"])
    outbound = {name: c for name, c in clusters.items() if name.startswith("outbound|")}
    assert set(outbound) == {REVIEWS_CLUSTER, "outbound|9090||reviews.shop.svc.cluster.local"}
    for name, cluster in outbound.items():
        assert cluster.lb_policy == cluster_pb2.Cluster.LEAST_REQUEST, name
        assert cluster.HasField("common_lb_config"), name
        assert not cluster.HasField("least_request_lb_config"), "Istio's defaults: Envoy's"
    others = {name: c for name, c in clusters.items() if name not in outbound}
    assert "PassthroughCluster" in others and "inbound|9080||" in others
    for name, cluster in others.items():
        if cluster.type == cluster_pb2.Cluster.ORIGINAL_DST:
            assert cluster.lb_policy == cluster_pb2.Cluster.CLUSTER_PROVIDED, name
    lifted = {name for name, cluster in clusters.items() if _unlimited(cluster)}
    assert lifted == set(clusters) - {"BlackHoleCluster"}, "Istio lifts all but the blackhole"
    assert not clusters["BlackHoleCluster"].HasField("circuit_breakers")


UNLIMITED = 2**32 - 1


def _unlimited(cluster: cluster_pb2.Cluster) -> bool:
    """Istio's default thresholds: one, of the default priority, every limit the largest."""
    [thresholds] = cluster.circuit_breakers.thresholds or [None]
    return (
        thresholds is not None
        and thresholds.priority == 0
        and (
            thresholds.max_connections.value,
            thresholds.max_pending_requests.value,
            thresholds.max_requests.value,
            thresholds.max_retries.value,
        )
        == (UNLIMITED,) * 4
    )


def test_the_inbound_route_retries_a_reset_before_request_except_on_grpc() -> None:
    with mesh() as m:
        ports = (("http", 9080), ("http2-api", 9081), ("grpc-api", 9090), ("grpc-web", 9091))
        m.updater.upsert_service(svc("reviews", *ports))
        m.updater.upsert_endpoints(endpoints("reviews", ["10.1.0.1"], *ports))
        m.flush()
        inbound = listener(m.connect(sidecar("10.1.0.1"), ADS))
    routes = {}
    for chain in inbound.filter_chains:
        for network_filter in chain.filters:
            manager = hcm_pb2.HttpConnectionManager()
            if network_filter.typed_config.Unpack(manager):
                [host] = manager.route_config.virtual_hosts
                [route] = host.routes
                routes[chain.name] = route.route
    for port in (9080, 9081):
        for suffix in ("mtls", "plaintext"):
            policy = routes[f"inbound|{port}||-{suffix}"].retry_policy
            assert policy.retry_on == "reset-before-request", port
            assert policy.num_retries.value == 2
            assert not policy.retry_host_predicate, "to the app on the pod: one host"
    for port in (9090, 9091):
        for suffix in ("mtls", "plaintext"):
            route = routes[f"inbound|{port}||-{suffix}"]
            assert not route.HasField("retry_policy"), f"gRPC port {port} must not replay"
