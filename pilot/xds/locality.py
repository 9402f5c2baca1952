"""Localities, and the priority an endpoint gets for a proxy by proximity.

An endpoint's locality is a region and a zone (pilot has no sub-zones). A
proxy declares its own in its bootstrap (`node.locality`). Where a cluster's
DestinationRule turns failover on (`pilot.builders.locality_lb`: outlier
detection, as Istio asks), the proxy gets that cluster's endpoints in
priorities, as Istio's locality failover gives them (`priorities`): same region
and zone 0, same region 1, anywhere else 2, and with the rule's `failover`
naming the proxy's region, regions other than its target 3. A level with no
endpoint is left out and the ones after move up, because Envoy wants priorities
contiguous from 0. A proxy's sub-zone changes nothing (no endpoint has one), so
proxies that differ only in it share one variant.

Each distinct proxy locality is one *flavor* of the ClusterLoadAssignments
(`flavor`): built once, shared by every proxy there. A proxy without a
locality reads the shared assignments.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from pilot.xds.cache import SHARED

SAME_ZONE, SAME_REGION, ELSEWHERE, PAST_FAILOVER = 0, 1, 2, 3
Failover = tuple[tuple[str, str], ...]  # (from region, to region), the rule's order


class Locality(NamedTuple):
    """A region and a zone; either may be empty (unknown). A tuple: thousands of
    endpoints are grouped by it on every rebuild, and tuples hash in C."""

    region: str = ""
    zone: str = ""

    def __bool__(self) -> bool:
        return bool(self.region or self.zone)

    @property
    def flavor(self) -> str:
        """The cache flavor of the assignments built for proxies here ("" for none)."""
        if not self:
            return SHARED
        # "/" separates, so it is escaped inside the names (bootstrap values are free text).
        return "/".join(p.replace("%", "%25").replace("/", "%2F") for p in self.parts())

    def parts(self) -> tuple[str, str]:
        return self.region, self.zone

    def __str__(self) -> str:
        return "/".join(self.parts())


NOWHERE = Locality()


def proximity(proxy: Locality, endpoint: Locality, failover: Failover = ()) -> int:
    """How far an endpoint is from a proxy: SAME_ZONE, SAME_REGION, ELSEWHERE, or
    PAST_FAILOVER (the first failover entry from the proxy's region names another)."""
    if proxy.region == endpoint.region:
        return SAME_ZONE if proxy.zone == endpoint.zone else SAME_REGION
    for source, target in failover:
        if source == proxy.region:
            return ELSEWHERE if endpoint.region == target else PAST_FAILOVER
    return ELSEWHERE


def priorities(
    proxy: Locality, localities: Iterable[Locality], failover: Failover = ()
) -> dict[Locality, int]:
    """Each endpoint locality's priority for `proxy`, contiguous from 0 (a proxy with no
    locality, as Istio's empty one: endpoints without one first)."""
    levels = {locality: proximity(proxy, locality, failover) for locality in set(localities)}
    rank = {level: i for i, level in enumerate(sorted(set(levels.values())))}
    return {locality: rank[level] for locality, level in levels.items()}
