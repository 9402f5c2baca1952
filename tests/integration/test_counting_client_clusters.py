"""Clusters that depend on the client, counted: what each change sends, to whom.

Bookinfo's reviews (9080, pods v1, v2, v3) in namespace shop, a public DestinationRule
in shop (subsets v1 and v2, a load balancer) and one written in namespace front for
reviews.shop (subset v3 alone, a connection limit). Three sidecars on delta ADS, each
with its Pod in the registry file and the identity its node metadata gives
(`--xds-auth none`; NAMESPACE, SERVICE_ACCOUNT, INTERCEPTION_MODE REDIRECT): shop's web
and ratings, front's client, each following clusters `*`, their assignments, listeners
`*` and route configuration 9080 as Envoy does. front's sidecar follows front's rule for
reviews (Istio's order: the client's namespace first): subset v3 and front's limit,
never subsets v1 or v2, nor shop's load balancer; shop's sidecars never hold v3.

What each change sends, and to whom: a pod moving to another address, assignments
alone, to all three (front's v3 only when v3's pod moved, shop's v1 only when v1's
did); front's limit changed, reviews' clusters to front's sidecar alone (then their
assignments, as Envoy warms a resent cluster); shop's load balancer changed, the same to
shop's sidecars alone (front follows its own rule); the v3 pod relabelled v1, assignments
alone (front's v3 loses it, shop's v1 gains it). Each step proves that nothing else was
written: pilot's count of the responses it wrote is exactly what the sidecars read.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2

from pilot.xds import types
from tests.integration.reviews_counting import (
    PODS,
    cluster,
    follow,
    read_one,
    reviews,
    reviews_subsets,
)
from tests.support.mesh import pod
from tests.support.pilot import RunningPilot, responses_written, running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, endpoint_ips, node

# ip -> (namespace, name): the client sidecars' Pods.
CLIENTS = {
    "10.44.0.7": ("shop", "web"),
    "10.44.0.8": ("shop", "ratings"),
    "10.44.0.9": ("front", "client"),
}
WEB, RATINGS, FRONT = CLIENTS
# The subsets of reviews each sidecar's rule gives it, and those it must never hold.
SEES = {WEB: ("v1", "v2"), RATINGS: ("v1", "v2"), FRONT: ("v3",)}
HIDDEN = {WEB: ("v3",), RATINGS: ("v3",), FRONT: ("v1", "v2")}
BASE = cluster("")
UNLIMITED = 2**32 - 1  # Istio's circuit-breaker maxima where no rule sets one
Held = dict[str, dict[str, Any]]
Read = tuple[str, set[str]]  # a response as `read_one` reports it: its type and names


@dataclass(frozen=True)
class Mesh:
    """The registry file: shop's load balancer, front's connection limit, where reviews'
    pods are (address -> version) and which version's pod carries another's label."""

    balancer: str = "ROUND_ROBIN"
    limit: int = 10
    pods: Mapping[str, str] = field(default_factory=lambda: dict(PODS))
    relabel: Mapping[str, str] = field(default_factory=dict)

    def moved(self, version: str, ip: str) -> Mesh:
        """This mesh with `version`'s pod (and its endpoint) at address `ip`."""
        pods = {old: v for old, v in self.pods.items() if v != version} | {ip: version}
        return dataclasses.replace(self, pods=pods)

    def objects(self) -> list[dict[str, Any]]:
        clients = [pod(name, ip, ns, service_account=name) for ip, (ns, name) in CLIENTS.items()]
        shop = reviews_subsets(("v1", "v2"), policy={"loadBalancer": {"simple": self.balancer}})
        pool = {"connectionPool": {"tcp": {"maxConnections": self.limit}}}
        front = reviews_subsets(("v3",), "front", pool)
        return [*reviews(pods=self.pods, relabel=self.relabel), *clients, shop, front]


def sidecar(client: XdsClient, ip: str) -> DeltaStream:
    ns, name = CLIENTS[ip]
    metadata = {"NAMESPACE": ns, "SERVICE_ACCOUNT": name, "INTERCEPTION_MODE": "REDIRECT"}
    return client.delta_ads(node(f"sidecar~{ip}~{name}-1.{ns}~{ns}.svc.cluster.local", metadata))


def max_connections(held: Held, name: str) -> int:
    found: cluster_pb2.Cluster = held[types.CLUSTER][name]
    return int(found.circuit_breakers.thresholds[0].max_connections.value)


def balancer(held: Held, name: str) -> int:
    found: cluster_pb2.Cluster = held[types.CLUSTER][name]
    return int(found.lb_policy)


def ips(held: Held, name: str) -> set[str]:
    return endpoint_ips(held[types.ENDPOINT][name])


def nothing_hidden(held: dict[str, Held]) -> None:
    """No sidecar was ever sent a subset its rule hides (`held` keeps every name sent)."""
    for ip, hidden in HIDDEN.items():
        for kind in (types.CLUSTER, types.ENDPOINT):
            assert not {cluster(v) for v in hidden} & held[ip][kind].keys(), (ip, kind)


@dataclass
class Sidecars:
    """The three sidecars' streams, what each holds, and the mesh pilot last read."""

    pilot: RunningPilot
    streams: dict[str, DeltaStream]
    held: dict[str, Held]
    mesh: Mesh

    async def change(self, mesh: Mesh, reads: Mapping[str, list[Read]]) -> None:
        """Write `mesh`: each sidecar reads exactly `reads` (none when absent), in order,
        and pilot writes nothing else."""
        stats = self.pilot.discovery.stats
        stats.reset()
        self.mesh = mesh
        self.pilot.write(mesh.objects())
        for ip, expected in reads.items():
            got = [await read_one(self.streams[ip], self.held[ip]) for _ in expected]
            assert got == expected, ip
        await responses_written(stats, Counter(kind for r in reads.values() for kind, _ in r))
        nothing_hidden(self.held)


def as_each_rule_says(held: dict[str, Held]) -> None:
    """front's sidecar holds front's subset and limit (and Istio's default balancer), shop's
    hold shop's subsets and balancer, without front's limit."""
    nothing_hidden(held)
    assert max_connections(held[FRONT], cluster("v3")) == 10
    assert max_connections(held[FRONT], BASE) == 10
    assert max_connections(held[WEB], BASE) == UNLIMITED
    assert balancer(held[WEB], BASE) == cluster_pb2.Cluster.ROUND_ROBIN
    assert balancer(held[FRONT], BASE) == cluster_pb2.Cluster.LEAST_REQUEST
    assert ips(held[FRONT], cluster("v3")) == {"10.44.1.3"}


async def pods_move(sidecars: Sidecars) -> None:
    """v1's pod moves, then v3's: assignments alone, to all three; front's v3 assignment
    only when v3's pod moved, shop's v1 only when v1's did."""
    held = sidecars.held
    shop_reads = [(types.ENDPOINT, {BASE, cluster("v1")})]
    reads = {WEB: shop_reads, RATINGS: shop_reads, FRONT: [(types.ENDPOINT, {BASE})]}
    await sidecars.change(sidecars.mesh.moved("v1", "10.44.1.11"), reads)
    assert ips(held[WEB], cluster("v1")) == {"10.44.1.11"}
    assert "10.44.1.11" in ips(held[FRONT], BASE)

    shop_reads = [(types.ENDPOINT, {BASE})]
    reads = {WEB: shop_reads, RATINGS: shop_reads, FRONT: [(types.ENDPOINT, {BASE, cluster("v3")})]}
    await sidecars.change(sidecars.mesh.moved("v3", "10.44.1.13"), reads)
    assert ips(held[FRONT], cluster("v3")) == {"10.44.1.13"}
    assert "10.44.1.13" in ips(held[RATINGS], BASE)


async def rules_change(sidecars: Sidecars) -> None:
    """front's limit changes: reviews' clusters, then their assignments (as Envoy warms a
    resent cluster), to front's sidecar alone. shop's balancer changes: the same to shop's
    sidecars alone; front's, which follows front's rule for reviews, hears nothing."""
    held = sidecars.held
    front = {BASE, cluster("v3")}
    reads = {FRONT: [(types.CLUSTER, front), (types.ENDPOINT, front)]}
    await sidecars.change(dataclasses.replace(sidecars.mesh, limit=3), reads)
    assert max_connections(held[FRONT], cluster("v3")) == 3
    assert max_connections(held[FRONT], BASE) == 3

    shop = {BASE, cluster("v1"), cluster("v2")}
    shop_reads = [(types.CLUSTER, shop), (types.ENDPOINT, shop)]
    await sidecars.change(
        dataclasses.replace(sidecars.mesh, balancer="RANDOM"),
        {WEB: shop_reads, RATINGS: shop_reads},
    )
    assert balancer(held[RATINGS], cluster("v2")) == cluster_pb2.Cluster.RANDOM
    assert balancer(held[FRONT], BASE) == cluster_pb2.Cluster.LEAST_REQUEST
    assert max_connections(held[WEB], BASE) == UNLIMITED


async def pod_relabelled(sidecars: Sidecars) -> None:
    """The v3 pod relabelled v1: assignments alone; front's v3 loses it, shop's v1 gains it."""
    held = sidecars.held
    shop_reads = [(types.ENDPOINT, {cluster("v1")})]
    reads = {WEB: shop_reads, RATINGS: shop_reads, FRONT: [(types.ENDPOINT, {cluster("v3")})]}
    await sidecars.change(dataclasses.replace(sidecars.mesh, relabel={"v3": "v1"}), reads)
    assert ips(held[FRONT], cluster("v3")) == set()
    assert ips(held[WEB], cluster("v1")) == {"10.44.1.11", "10.44.1.13"}


async def test_client_dependent_changes_push_clusters_to_the_sidecars_they_concern_alone(
    tmp_path: Path,
) -> None:
    mesh = Mesh()
    async with (
        running_pilot(tmp_path, mesh.objects()) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        streams = {ip: sidecar(client, ip) for ip in CLIENTS}
        held = {ip: await follow(streams[ip], ["9080"], SEES[ip]) for ip in CLIENTS}
        as_each_rule_says(held)
        sidecars = Sidecars(pilot, streams, held, mesh)
        await pods_move(sidecars)
        await rules_change(sidecars)
        await pod_relabelled(sidecars)
