"""Envoy accepts the clusters a DestinationRule makes, and subsets hold only their pods.

The registry file (the file source) holds bookinfo's reviews with three pods (v1, v2,
v3) and a DestinationRule as istio.io's tasks write it, with every part of a traffic
policy pilot builds; what pilot serves a sidecar goes into a bootstrap that `envoy
--mode validate` must accept. Then fuzzed DestinationRules (hypothesis), many to one
file: whatever pilot accepts of them, Envoy accepts too; the rest pilot refuses with a
warning naming each, and the good objects of the same file still apply.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot.registry.destination_rule import parse_destination_rule
from pilot.registry.istio_config import ConfigError
from pilot.xds import types
from tests.integration.envoy_validation import POD_ID, POD_IP, bootstrap_of
from tests.support.envoy_process import validate_bootstrap
from tests.support.mesh import Ep, endpoint_slice, pod, service
from tests.support.pilot import running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

HOST = "reviews.shop.svc.cluster.local"
TIMEOUT = 30.0
PODS = {"10.44.1.1": "v1", "10.44.1.2": "v2", "10.44.1.3": "v3"}


def bookinfo() -> list[dict[str, Any]]:
    """reviews (9080) with a pod per version, and the sidecar's own pod (POD_IP)."""
    pods = [
        pod(f"reviews-{v}", ip, "shop", sidecar=True, labels={"version": v})
        for ip, v in PODS.items()
    ]
    return [
        service("reviews", "shop", [("http", 9080)]),
        endpoint_slice(
            "reviews",
            [Ep(ip, pod=f"reviews-{v}") for ip, v in PODS.items()],
            "shop",
            [("http", 9080)],
        ),
        *pods,
        service("productpage", "shop", [("http", 8080)]),
        endpoint_slice("productpage", [Ep(POD_IP, pod="productpage-1")], "shop"),
        pod("productpage-1", POD_IP, "shop", sidecar=True),
    ]


def rule(name: str, spec: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    return {
        "apiVersion": f"networking.istio.io/{version}",
        "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": spec,
    }


FULL_POLICY = {
    "loadBalancer": {"simple": "LEAST_REQUEST"},
    "connectionPool": {
        "tcp": {"maxConnections": 1, "connectTimeout": "30ms"},
        "http": {
            "http1MaxPendingRequests": 1,
            "http2MaxRequests": 10,
            "maxRequestsPerConnection": 1,
            "maxRetries": 3,
            "idleTimeout": "1m",
        },
    },
    "outlierDetection": {
        "consecutive5xxErrors": 1,
        "consecutiveGatewayErrors": 2,
        "interval": "1s",
        "baseEjectionTime": "3m",
        "maxEjectionPercent": 100,
        "minHealthPercent": 20,
    },
    "portLevelSettings": [{"port": {"number": 9080}, "loadBalancer": {"simple": "RANDOM"}}],
}
SUBSETS = [
    {"name": "v1", "labels": {"version": "v1"}},
    {
        "name": "v2",
        "labels": {"version": "v2"},
        "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "end-user"}}},
    },
    {"name": "v3", "labels": {"version": "v3"}, "trafficPolicy": {"tls": {"mode": "DISABLE"}}},
]


async def fetch(stream: DeltaStream, until: set[str]) -> dict[str, dict[str, Any]]:
    """Clusters, listeners and the assignments of `until` (cluster names), over delta ADS."""
    held: dict[str, dict[str, Any]] = {
        t: {} for t in (types.CLUSTER, types.LISTENER, types.ROUTE, types.ENDPOINT)
    }
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.LISTENER, ["*"])
    await stream.subscribe(types.ENDPOINT, sorted(until))
    while not (until <= held[types.ENDPOINT].keys() and until <= held[types.CLUSTER].keys()):
        response = await stream.next_response(TIMEOUT)
        for name, resource in delta_resources(response).items():
            held[response.type_url][name] = resource.message
        await stream.ack(response)
    return held


def addresses(assignment: endpoint_pb2.ClusterLoadAssignment) -> set[str]:
    return {
        lb.endpoint.address.socket_address.address
        for group in assignment.endpoints
        for lb in group.lb_endpoints
    }


def subset(name: str) -> str:
    return f"outbound|9080|{name}|{HOST}"


async def test_envoy_validates_subsets_and_traffic_policy(tmp_path: Path) -> None:
    objects = [
        *bookinfo(),
        rule("reviews", {"host": "reviews", "trafficPolicy": FULL_POLICY, "subsets": SUBSETS}),
    ]
    wanted = {subset("v1"), subset("v2"), subset("v3"), f"outbound|9080||{HOST}"}
    async with (
        running_pilot(tmp_path, objects) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        held = await fetch(client.delta_ads(node(POD_ID)), wanted)
    clusters: dict[str, cluster_pb2.Cluster] = held[types.CLUSTER]
    for version, ip in ((v, ip) for ip, v in PODS.items()):
        assert addresses(held[types.ENDPOINT][subset(version)]) == {ip}
    assert addresses(held[types.ENDPOINT][f"outbound|9080||{HOST}"]) == set(PODS)
    # The rule's port-level settings replace its policy at 9080, whole: RANDOM, no pool
    # (so Istio's default thresholds, every one unlimited).
    assert clusters[subset("v1")].lb_policy == cluster_pb2.Cluster.RANDOM
    [threshold] = clusters[subset("v1")].circuit_breakers.thresholds
    assert threshold.max_retries.value == threshold.max_connections.value == 2**32 - 1
    assert clusters[subset("v2")].lb_policy == cluster_pb2.Cluster.RING_HASH
    assert clusters[subset("v1")].transport_socket_matches  # auto mTLS where tls is absent
    assert not clusters[subset("v3")].transport_socket_matches  # DISABLE: plaintext
    assert not clusters[subset("v3")].HasField("transport_socket")
    bootstrap = tmp_path / "bootstrap.pb"
    bootstrap.write_bytes(bootstrap_of(held).SerializeToString())
    validate_bootstrap(bootstrap)


async def test_envoy_validates_every_part_of_a_policy(tmp_path: Path) -> None:
    """The policy without port-level settings: circuit breakers, outlier detection, TLS."""
    policy = {k: v for k, v in FULL_POLICY.items() if k != "portLevelSettings"}
    subsets = [
        {
            "name": "v1",
            "labels": {"version": "v1"},
            "trafficPolicy": {
                "tls": {
                    "mode": "SIMPLE",
                    "sni": "reviews.example.com",
                    "subjectAltNames": ["reviews.example.com"],
                }
            },
        },
        {
            "name": "v2",
            "labels": {"version": "v2"},
            "trafficPolicy": {
                "tls": {
                    "mode": "ISTIO_MUTUAL",
                    "subjectAltNames": ["spiffe://cluster.local/ns/shop/sa/x"],
                }
            },
        },
        {"name": "v3", "labels": {"version": "v3"}, "trafficPolicy": {"tls": {"mode": "MUTUAL"}}},
    ]
    objects = [
        *bookinfo(),
        rule("reviews", {"host": HOST, "trafficPolicy": policy, "subsets": subsets}, "v1beta1"),
    ]
    wanted = {subset("v1"), subset("v2")}
    async with (
        running_pilot(tmp_path, objects) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        held = await fetch(client.delta_ads(node(POD_ID)), wanted)
    clusters: dict[str, cluster_pb2.Cluster] = held[types.CLUSTER]
    main = clusters[f"outbound|9080||{HOST}"]
    threshold = main.circuit_breakers.thresholds[0]
    assert (threshold.max_connections.value, threshold.max_pending_requests.value) == (1, 1)
    assert (threshold.max_requests.value, threshold.max_retries.value) == (10, 3)
    assert main.connect_timeout.ToMilliseconds() == 30
    assert main.outlier_detection.consecutive_5xx.value == 1
    assert main.outlier_detection.base_ejection_time.seconds == 180
    assert main.common_lb_config.healthy_panic_threshold.value == 20
    assert main.lb_policy == cluster_pb2.Cluster.LEAST_REQUEST
    assert clusters[subset("v1")].transport_socket.name == "envoy.transport_sockets.tls"
    # MUTUAL (client certificates pilot cannot give): no endpoint, never plaintext.
    failed = clusters[subset("v3")]
    assert failed.type == cluster_pb2.Cluster.STATIC and not failed.load_assignment.endpoints
    bootstrap = tmp_path / "bootstrap.pb"
    bootstrap.write_bytes(bootstrap_of(held).SerializeToString())
    validate_bootstrap(bootstrap)


# -- fuzzed rules --------------------------------------------------------------------

_durations = st.sampled_from(["1ms", "30ms", "1s", "0.5s", "3m", "1h", "0s", "-1s", "x", 5])
_counts = st.one_of(st.integers(-2, 2**32 + 1), st.sampled_from(["7", "abc", None, True]))
_pool = st.fixed_dictionaries(
    {},
    optional={
        "tcp": st.fixed_dictionaries(
            {}, optional={"maxConnections": _counts, "connectTimeout": _durations}
        ),
        "http": st.fixed_dictionaries(
            {},
            optional={
                "http1MaxPendingRequests": _counts,
                "http2MaxRequests": _counts,
                "maxRequestsPerConnection": _counts,
                "maxRetries": _counts,
                "idleTimeout": _durations,
            },
        ),
    },
)
_outlier = st.fixed_dictionaries(
    {},
    optional={
        "consecutive5xxErrors": _counts,
        "consecutiveGatewayErrors": _counts,
        "interval": _durations,
        "baseEjectionTime": _durations,
        "maxEjectionPercent": st.integers(-1, 101),
        "minHealthPercent": st.integers(-1, 101),
    },
)
_lb = st.one_of(
    st.fixed_dictionaries(
        {
            "simple": st.sampled_from(
                ["ROUND_ROBIN", "LEAST_REQUEST", "LEAST_CONN", "RANDOM", "PASSTHROUGH", "BOGUS"]
            )
        }
    ),
    st.fixed_dictionaries(
        {
            "consistentHash": st.one_of(
                st.fixed_dictionaries({"httpHeaderName": st.text(max_size=8)}),
                st.fixed_dictionaries({"useSourceIp": st.booleans()}),
                st.fixed_dictionaries(
                    {
                        "httpCookie": st.fixed_dictionaries(
                            {"name": st.text(max_size=8)}, optional={"ttl": _durations}
                        )
                    }
                ),
                st.fixed_dictionaries(
                    {
                        "ringHash": st.fixed_dictionaries(
                            {"minimumRingSize": st.integers(0, 1 << 24)}
                        )
                    }
                ),
            )
        }
    ),
)
_tls = st.fixed_dictionaries(
    {"mode": st.sampled_from(["DISABLE", "SIMPLE", "ISTIO_MUTUAL", "MUTUAL", "WRONG"])},
    optional={
        "sni": st.text(max_size=20),
        "subjectAltNames": st.lists(st.text(min_size=1, max_size=20), max_size=3),
        "insecureSkipVerify": st.booleans(),
        "credentialName": st.just("secret"),
        "caCertificates": st.just("/no/such/ca.pem"),
    },
)
_policy = st.fixed_dictionaries(
    {},
    optional={
        "loadBalancer": _lb,
        "connectionPool": _pool,
        "outlierDetection": _outlier,
        "tls": _tls,
        "portLevelSettings": st.lists(
            st.fixed_dictionaries(
                {"port": st.fixed_dictionaries({"number": st.sampled_from([9080, 80, 0, 70000])})},
                optional={"loadBalancer": _lb, "connectionPool": _pool},
            ),
            max_size=2,
        ),
    },
)
_subsets = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["v1", "v2", "v3", "V1", "bad|name", "x" * 70]),
            "labels": st.dictionaries(
                st.sampled_from(["version", "app"]),
                st.sampled_from(["v1", "v2", "reviews"]),
                max_size=2,
            ),
        },
        optional={"trafficPolicy": _policy},
    ),
    max_size=4,
)
_rules = st.lists(
    st.fixed_dictionaries({"trafficPolicy": _policy, "subsets": _subsets}), min_size=1, max_size=12
)


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(specs=_rules)
def test_envoy_validates_fuzzed_destination_rules(tmp_path_factory: Any, specs: list[Any]) -> None:
    """Each fuzzed rule is for a service of its own; what pilot accepts, Envoy accepts."""
    tmp_path = tmp_path_factory.mktemp("fuzz")
    objects = list(bookinfo())
    for i, spec in enumerate(specs):
        objects.append(service(f"svc{i}", "shop", [("http", 9080), ("grpc", 7070)]))
        objects.append(rule(f"r{i}", {"host": f"svc{i}", **spec}))
    asyncio.run(_validate_fuzzed(tmp_path, objects))


def expected_subsets(objects: list[dict[str, Any]]) -> set[str]:
    """The subset clusters of the rules pilot's parser accepts (the rest are refused)."""
    names = set()
    for obj in objects:
        if obj["kind"] != "DestinationRule":
            continue
        try:
            parsed = parse_destination_rule(obj, "cluster.local")
        except ConfigError:
            continue
        ports = (9080,) if "reviews" in parsed.host else (9080, 7070)
        names |= {f"outbound|{p}|{s.name}|{parsed.host}" for s in parsed.subsets for p in ports}
    return names


def subset_clusters(held: dict[str, dict[str, Any]]) -> set[str]:
    return {n for n in held[types.CLUSTER] if n.startswith("outbound|") and "||" not in n}


async def _validate_fuzzed(tmp_path: Path, objects: list[dict[str, Any]]) -> None:
    wanted = {f"outbound|9080||{HOST}"}
    async with (
        running_pilot(tmp_path, objects) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        held = await fetch(client.delta_ads(node(POD_ID)), wanted)
    assert subset_clusters(held) == expected_subsets(objects)
    bootstrap = tmp_path / "bootstrap.pb"
    bootstrap.write_bytes(bootstrap_of(held).SerializeToString())
    validate_bootstrap(bootstrap)
