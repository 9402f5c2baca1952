"""A push request: what changed since the last push, as one mergeable value.

Registry changes say which services need clusters rebuilt (full) and which
only their endpoints; certificate changes name the proxies whose workload
certificate was minted or rotated. Merging two requests is their union, so
any number of changes waiting for a push stay one bounded value.
"""

from __future__ import annotations

from dataclasses import dataclass

from pilot.registry.index import NO_CHANGE, IndexChange
from pilot.xds.proxy import ProxyKey


@dataclass(frozen=True, slots=True)
class PushRequest:
    """Changed services (full or endpoints only) and proxies with a new certificate."""

    registry: IndexChange = NO_CHANGE
    certificates: frozenset[ProxyKey] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.registry or self.certificates)

    def merge(self, other: PushRequest) -> PushRequest:
        if not other:
            return self
        if not self:
            return other
        return PushRequest(
            self.registry.merge(other.registry), self.certificates | other.certificates
        )


NO_PUSH = PushRequest()
