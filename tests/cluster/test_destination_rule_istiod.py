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

A rule that is not public in the service's namespace applies to some sidecars only;
pilot gives it to a sidecar whose namespace is proven (a token bound to its Pod over
pilot's TLS port), istiod to the namespace its node names. One Pod of the service's
namespace S and one of a client namespace C each read, from both servers, every
cluster of the service: the same clusters, field for field, in each case:

- a rule written in C for S's service: C's sidecar follows it, S's gets no subset;
- a rule in S exported to `.` alone: S's sidecar follows it, C's gets no subset;
- a rule in S exported to C by name: C's sidecar follows it, S's gets no subset.

A stream on pilot's plaintext port that names the following sidecar's node and
namespace but proves nothing gets no subset from pilot either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2

from pilot.xds import types
from tests.cluster.control_plane import ControlPlane
from tests.cluster.istiod_server import (
    Dial,
    SideBySide,
    clusters_of,
    resources_of,
    side_by_side,
)
from tests.cluster.workloads import (
    SERVICE_PORT,
)
from tests.support.mesh import istio_object

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


async def test_two_rules_for_one_host_merge_as_istiod_merges_them(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """The older rule's subsets and no policy, the newer one's policy and subsets: one
    rule with both policies' first and every subset, the older's of a name given twice
    (the API server stamps seconds: the names order rules created in the same one)."""
    host = f"reviews.{namespace}.svc.cluster.local"
    older = {"host": "reviews", "subsets": [SUBSETS[0]]}
    twice = {"name": "v1", "labels": {"app": "nothing"}}
    newer = {"host": "reviews", "trafficPolicy": POLICY, "subsets": [SUBSETS[1], twice]}
    rules = [
        istio_object("DestinationRule", "a-older", namespace, older),
        istio_object("DestinationRule", "b-newer", namespace, newer),
    ]
    names = {f"outbound|{SERVICE_PORT}|{s}|{host}" for s in ("", "v1", "hashed")}
    async with side_by_side(deployed, namespace, tmp_path, "reviews", rules) as both:
        ours, theirs = [
            await clusters_of(both.servers[k], both.node_id, names) for k in ("pilot", "istiod")
        ]
        v1 = f"outbound|{SERVICE_PORT}|v1|{host}"
        assigned = [
            await resources_of(both.servers[k], both.node_id, types.ENDPOINT, [v1], {v1})
            for k in ("pilot", "istiod")
        ]
    for cluster in sorted(names):
        assert written(ours[cluster]) == written(theirs[cluster]), cluster
    limits = ours[f"outbound|{SERVICE_PORT}||{host}"].circuit_breakers.thresholds
    assert limits[0].max_connections.value == 1  # the newer rule's policy
    # v1 is the older rule's (app: reviews), its Pod behind it on both servers
    ours_v1, theirs_v1 = (len(a[v1].endpoints[0].lb_endpoints) for a in assigned)
    assert ours_v1 == theirs_v1 == 1


# ------------------------------------------------------------------ per client namespace

CLIENT, SERVICE = "client", "service"  # C and S, named in each Case
EVERY_SUBSET = {""} | {s["name"] for s in SUBSETS}  # "": the service's own cluster


@dataclass(frozen=True)
class Case:
    """Where the rule is written, whom it is exported to (CLIENT, SERVICE: those
    namespaces; None: no exportTo), and whose sidecar follows it."""

    written_in: str
    export_to: tuple[str, ...] | None
    follows: str


CASES = {
    "written-in-the-client": Case(CLIENT, None, follows=CLIENT),
    "private-to-the-service": Case(SERVICE, (".",), follows=SERVICE),
    "exported-to-the-client-by-name": Case(SERVICE, (CLIENT,), follows=CLIENT),
}


def _rule(case: Case, namespaces: dict[str, str], host: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"host": host, "trafficPolicy": POLICY, "subsets": SUBSETS}
    if case.export_to is not None:
        spec["exportTo"] = [namespaces.get(e, e) for e in case.export_to]
    return istio_object("DestinationRule", "reviews", namespaces[case.written_in], spec)


async def _subsets_alike(both: SideBySide, namespace: str, host: str) -> set[str]:
    """The subsets of `host` whose clusters `namespace`'s sidecar gets, after checking
    that pilot sends it the same clusters as istiod, field for field."""
    sidecar = both.sidecars[namespace]
    ours, theirs = [await sidecar.clusters_of(k, host) for k in ("pilot", "istiod")]
    assert sorted(ours) == sorted(theirs), namespace
    for name, cluster in ours.items():
        assert written(cluster) == written(theirs[name]), (namespace, name)
    return _subsets(ours)


async def _subsets_claimed(both: SideBySide, namespace: str, host: str) -> set[str]:
    """The subsets of `host` whose clusters pilot sends a stream on its plaintext port
    that says it is `namespace`'s sidecar (node id, metadata) and proves nothing."""
    claiming = replace(both.sidecars[namespace], dials={"pilot": Dial(both.servers["pilot"])})
    return _subsets(await claiming.clusters_of("pilot", host))


def _subsets(clusters: Iterable[str]) -> set[str]:
    return {name.split("|")[2] for name in clusters}


@pytest.mark.parametrize("case", list(CASES))
async def test_pilots_clusters_for_a_rule_seen_from_some_namespaces_are_istiods(
    deployed: ControlPlane, namespace: str, client_namespace: str, tmp_path: Path, case: str
) -> None:
    rule_case = CASES[case]
    host = f"reviews.{namespace}.svc.cluster.local"
    namespaces = {CLIENT: client_namespace, SERVICE: namespace}
    follows = namespaces[rule_case.follows]
    (other,) = set(namespaces.values()) - {follows}
    rule = _rule(rule_case, namespaces, host)
    async with side_by_side(
        deployed, namespace, tmp_path, "reviews", [rule], clients=[client_namespace]
    ) as both:
        # The sidecar that follows the rule first: once it reads the subsets, both
        # servers hold the rule, so the other's reading none of them means something.
        assert await _subsets_alike(both, follows, host) == EVERY_SUBSET
        assert await _subsets_alike(both, other, host) == {""}
        # istiod's plaintext port takes the node's word; pilot's takes no claim for proof.
        assert await _subsets_claimed(both, follows, host) == {""}
