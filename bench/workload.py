"""The bench's mesh and its endpoint changes: S services, each one port and one EndpointSlice.

Service i is `svc-NNNN` in namespace `default` with port 80 (`http`, target
8080) and E ready endpoints. A change replaces one endpoint of one service,
drawn at random (seeded), with an address never used before, so every change
gives its assignment new content and a new version. Addresses are made-up
10.0.0.0/8 data: nothing ever connects to them.
"""

from __future__ import annotations

import copy
import ipaddress
import random
from dataclasses import dataclass
from typing import Any

from bench import wire
from tests.support.mesh import Ep, as_list, cluster_name, endpoint_slice, service

Obj = dict[str, Any]
_BASE = int(ipaddress.IPv4Address("10.0.0.0"))


@dataclass(frozen=True)
class Change:
    """One endpoint change: the slice to apply and the clusters whose assignments it changes."""

    cluster: str
    slice: Obj
    more_clusters: tuple[str, ...] = ()  # the service's other ports'

    @property
    def label(self) -> str:
        return self.cluster

    @property
    def expected(self) -> frozenset[tuple[str, str]]:
        """What every client is sent for it: the new assignment of each cluster."""
        return frozenset((wire.ENDPOINT, c) for c in (self.cluster, *self.more_clusters))


class Workload:
    """The mesh's current slices, and a stream of random one-endpoint changes."""

    def __init__(self, services: int, endpoints: int, seed: int = 1) -> None:
        self.services = services
        self.endpoints = endpoints
        self._next_ip = 1
        self._rng = random.Random(seed)
        self.first_changed = 0  # endpoints below this index never change
        self.names = [f"svc-{i:04d}" for i in range(services)]
        self.slices = [
            endpoint_slice(name, [Ep(self._fresh_ip()) for _ in range(endpoints)])
            for name in self.names
        ]

    def _fresh_ip(self) -> str:
        address = str(ipaddress.IPv4Address(_BASE + self._next_ip))
        self._next_ip += 1
        return address

    def yaml(self) -> str:
        """Every Service and EndpointSlice, as one `kind: List` document."""
        services = [service(name) for name in self.names]
        return as_list([*services, *self.slices])

    def clusters(self) -> list[str]:
        return [cluster_name(name) for name in self.names]

    def change(self) -> Change:
        """Replace one endpoint of a random service with a fresh address."""
        i = self._rng.randrange(self.services)
        updated = copy.deepcopy(self.slices[i])
        endpoint = updated["endpoints"][self._rng.randrange(self.first_changed, self.endpoints)]
        endpoint["addresses"] = [self._fresh_ip()]
        self._moved(i, endpoint)
        self.slices[i] = updated
        return Change(cluster_name(self.names[i]), updated, self._more_clusters(i))

    def _moved(self, service: int, endpoint: Obj) -> None:
        """Hook: an endpoint of a service was given a fresh address."""

    def _more_clusters(self, service: int) -> tuple[str, ...]:
        """Hook: the clusters of a service's ports after the first (none here)."""
        return ()
