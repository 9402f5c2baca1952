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

from tests.support.mesh import Ep, as_list, cluster_name, endpoint_slice, service

Obj = dict[str, Any]
_BASE = int(ipaddress.IPv4Address("10.0.0.0"))


@dataclass(frozen=True)
class Change:
    """One endpoint change: the slice to apply and the cluster whose assignment it changes."""

    cluster: str
    slice: Obj


class Workload:
    """The mesh's current slices, and a stream of random one-endpoint changes."""

    def __init__(self, services: int, endpoints: int, seed: int = 1) -> None:
        self.services = services
        self.endpoints = endpoints
        self._next_ip = 1
        self._rng = random.Random(seed)
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
        endpoint = updated["endpoints"][self._rng.randrange(self.endpoints)]
        endpoint["addresses"] = [self._fresh_ip()]
        self.slices[i] = updated
        return Change(cluster_name(self.names[i]), updated)
