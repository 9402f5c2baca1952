"""Which services claim which keys (a listener's address and port, a route configuration's
port): the bookkeeping the LDS and RDS generators share.

A service's claims move as a whole when it changes: `reclaim` drops what it claimed
before, records what it claims now, and returns every key either touched, which is
what the generator rebuilds. A key's claimants are its services in the order they
first claimed it (the first claim of a service on a key is kept).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from pilot.registry.model import ServiceKey

K = TypeVar("K")
V = TypeVar("V")


class ServiceClaims(Generic[K, V]):
    """key -> {service: what it claims there}, and service -> its keys."""

    def __init__(self) -> None:
        self._by_key: dict[K, dict[ServiceKey, V]] = {}
        self._keys_of: dict[ServiceKey, set[K]] = {}

    def reclaim(self, service: ServiceKey, claims: Iterable[tuple[K, V]]) -> set[K]:
        """The service now claims exactly these; every key it claimed or claims."""
        old = self._keys_of.pop(service, set())
        for key in old:
            self._by_key[key].pop(service, None)
        new: set[K] = set()
        for key, value in claims:
            self._by_key.setdefault(key, {}).setdefault(service, value)
            new.add(key)
        if new:
            self._keys_of[service] = new
        return old | new

    def of(self, key: K) -> dict[ServiceKey, V]:
        """The key's claimants (empty: none; the key is then forgotten)."""
        claimants = self._by_key.get(key)
        if not claimants:
            self._by_key.pop(key, None)
            return {}
        return claimants

    def keys(self) -> list[K]:
        """Every key some service claims."""
        return [key for key, claimants in self._by_key.items() if claimants]
