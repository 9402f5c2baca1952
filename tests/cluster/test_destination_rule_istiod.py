"""pilot's clusters for a DestinationRule are istiod's, field for field.

The same API server, the same Service, Pod and DestinationRule (through the CRD):
istiod (tools/istiod/build: Go and the Go module proxy; skipped without Go) and
pilot each serve one sidecar of the namespace, and every field a rule writes in a
cluster (load balancer, ring hash, circuit breakers, connect timeout, upstream HTTP
options, outlier detection, panic threshold) is the same in both, for the service's
cluster, a subset's with its own policy, and a port-level override.

One difference is Istio's default, not the rule's: istiod (PILOT_AUTO_SEND_UNHEALTHY_
ENDPOINTS, on by default) sends unready endpoints and so turns the panic threshold
off (0) on every cluster whose rule gives no outlierDetection; pilot leaves unready
endpoints out and keeps Envoy's default there. The panic threshold is compared where
the rule's outlierDetection sets it.
"""

from __future__ import annotations

from pathlib import Path

from envoy.config.cluster.v3 import cluster_pb2

from tests.cluster.control_plane import ControlPlane
from tests.cluster.istiod_server import clusters_of, side_by_side
from tests.cluster.workloads import (
    SERVICE_PORT,
)

# What a DestinationRule writes in a cluster.
FIELDS = (
    "lb_policy",
    "ring_hash_lb_config",
    "circuit_breakers",
    "connect_timeout",
    "typed_extension_protocol_options",
    "outlier_detection",
    "common_lb_config",
)
POLICY = {
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
}
SUBSETS = [
    {"name": "v1", "labels": {"app": "reviews"}},
    {
        "name": "hashed",
        "labels": {"app": "reviews"},
        "trafficPolicy": {
            "loadBalancer": {"consistentHash": {"httpHeaderName": "end-user"}},
            "outlierDetection": {"consecutive5xxErrors": 0},
        },
    },
    {
        "name": "port",
        "labels": {"app": "reviews"},
        "trafficPolicy": {
            "portLevelSettings": [
                {
                    "port": {"number": SERVICE_PORT},
                    "loadBalancer": {"simple": "RANDOM"},
                    "connectionPool": {"http": {"maxRetries": 7}},
                }
            ]
        },
    },
]


def written(cluster: cluster_pb2.Cluster) -> dict[str, str]:
    fields = FIELDS if cluster.HasField("outlier_detection") else FIELDS[:-1]
    return {field: str(getattr(cluster, field)) for field in fields}


async def test_pilots_clusters_for_a_rule_are_istiods(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    host = f"reviews.{namespace}.svc.cluster.local"
    names = {f"outbound|{SERVICE_PORT}|{s}|{host}" for s in ("", "v1", "hashed", "port")}
    spec = {"host": "reviews", "trafficPolicy": POLICY, "subsets": SUBSETS}
    async with side_by_side(
        deployed, namespace, tmp_path, "reviews", [("DestinationRule", spec)]
    ) as both:
        ours, theirs = [
            await clusters_of(both.servers[k], both.node_id, names) for k in ("pilot", "istiod")
        ]
    for cluster in sorted(names):
        assert written(ours[cluster]) == written(theirs[cluster]), cluster
    assert not ours[f"outbound|{SERVICE_PORT}|port|{host}"].HasField("outlier_detection")
