"""What a cluster's locality load balancing does, as istiod decides it.

Istio's rule (pilot/pkg/networking/core/loadbalancer, `ApplyLocalityLoadBalancer`,
with the mesh's default `localityLbSetting: {enabled: true}`), for the policy one
cluster gets (`pilot.registry.destination_rule.policy_for`):

- `enabled: false`: nothing; every endpoint in priority 0, no weights.
- `distribute`: the locality weights of the first entry whose `from` matches the
  proxy's locality (`*` matches any region, zone or sub-zone; a missing zone any
  zone); each `to` locality shares its weight among the endpoint localities it
  matches, in proportion to their endpoints (rounded up); an endpoint locality no
  `to` matches keeps its place, with no endpoint. No priorities.
- otherwise, only with `outlierDetection` (without it Envoy never sees a host fail,
  so it would never move down a priority): priorities by proximity, with the
  rule's `failover` regions (`pilot.xds.locality.priorities`).
- otherwise (the default with no DestinationRule): every endpoint in priority 0.

A cluster whose rule gives `distribute`, or `failover` with outlier detection, carries
`common_lb_config.locality_weighted_lb_config` (istiod's `ApplyToCluster`); its
assignments then give each locality its weight (the number of its endpoints where
`distribute` says nothing else), which Envoy reads only there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from envoy.config.cluster.v3 import cluster_pb2

from pilot.registry.destination_rule import PortPolicy
from pilot.registry.locality_lb import WILDCARD, Distribute, LocalityLbSetting
from pilot.xds.locality import Failover, Locality, priorities

MESH_DEFAULT = LocalityLbSetting()  # Istio's mesh config: `localityLbSetting: {enabled: true}`


@dataclass(frozen=True, slots=True)
class LocalityRule:
    """What one cluster's assignment does with the calling proxy's locality."""

    distribute: tuple[Distribute, ...] = ()
    failover: bool = False  # priorities by proximity
    failover_to: Failover = ()

    @property
    def weighted(self) -> bool:
        """Whether the cluster balances by locality weights (and the assignment gives them)."""
        return bool(self.distribute) or (self.failover and bool(self.failover_to))

    @property
    def by_locality(self) -> bool:
        """Whether the assignment depends on the proxy's locality at all."""
        return bool(self.distribute) or self.failover


FLAT = LocalityRule()


def locality_rule(policy: PortPolicy) -> LocalityRule:
    """The rule one cluster follows, from the policy it gets."""
    written = policy.load_balancer.locality if policy.load_balancer is not None else None
    setting = MESH_DEFAULT if written is None else written
    if not setting.enabled:
        return FLAT
    if setting.distribute:
        return LocalityRule(distribute=setting.distribute)
    if policy.outlier_detection is not None:
        return LocalityRule(failover=True, failover_to=setting.failover)
    return FLAT


def apply_locality_rule(cluster: cluster_pb2.Cluster, rule: LocalityRule) -> None:
    """Locality-weighted balancing on `cluster` where its rule weights localities."""
    if rule.weighted:
        cluster.common_lb_config.locality_weighted_lb_config.SetInParent()


def matches(locality: Locality, pattern: str) -> bool:
    """Istio's `LocalityMatch`: `region[/zone[/subzone]]`, `*` for any part (pilot has no
    sub-zones: a pattern's sub-zone is `*` or absent)."""
    parts = pattern.split("/")
    region, zone = parts[0], parts[1] if len(parts) > 1 else ""
    return region in (WILDCARD, locality.region) and zone in ("", WILDCARD, locality.zone)


@dataclass(frozen=True, slots=True)
class Placement:
    """A locality's place in one proxy's assignment."""

    priority: int = 0
    weight: int | None = None  # None: no load_balancing_weight
    dropped: bool = False  # `distribute` sends it nothing: its endpoints are left out


def placements(
    rule: LocalityRule, proxy: Locality, sizes: Mapping[Locality, int]
) -> dict[Locality, Placement]:
    """Each endpoint locality's placement for `proxy` (`sizes`: its endpoints' count)."""
    if rule.distribute:
        return _distributed(rule.distribute, proxy, sizes)
    levels = priorities(proxy, sizes, rule.failover_to) if rule.failover else {}
    return {
        locality: Placement(levels.get(locality, 0), size if rule.weighted else None)
        for locality, size in sizes.items()
    }


def _distributed(
    distribute: tuple[Distribute, ...], proxy: Locality, sizes: Mapping[Locality, int]
) -> dict[Locality, Placement]:
    chosen = next((d for d in distribute if matches(proxy, d.source)), None)
    if chosen is None:
        return {locality: Placement(weight=size) for locality, size in sizes.items()}
    found: dict[Locality, Placement] = {}
    for pattern, weight in chosen.to:  # the keys do not overlap (validation)
        matched = {loc: n for loc, n in sizes.items() if loc not in found and matches(loc, pattern)}
        total = sum(matched.values())
        for locality, size in matched.items():
            found[locality] = Placement(weight=math.ceil(size * weight / total))
    for locality, size in sizes.items():
        found.setdefault(locality, Placement(weight=size, dropped=True))
    return found
