"""The one way sources change the registry: upsert, delete, replace-all.

The file source replaces everything with each good version of the file; the
Kubernetes informers upsert and delete objects as they change. Whatever
implements this interface applies the change to the endpoint index and hands
what it means (no push, endpoints only, or full) to the push pipeline, so a
source never knows who listens.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from pilot.registry.model import (
    EndpointSet,
    EndpointSetKey,
    Node,
    NodeKey,
    Pod,
    PodKey,
    Service,
    ServiceKey,
)
from pilot.registry.peer_authentication import PeerAuthentication, PeerAuthenticationKey


class RegistryUpdater(Protocol):
    """Changes to the registry, as sources make them."""

    def upsert(self, obj: Service | EndpointSet | Node | Pod) -> None:
        """A Service, an endpoint set, a Node (its locality) or a Pod was added or changed."""
        ...

    def delete(
        self, key: ServiceKey | EndpointSetKey | NodeKey | PodKey, cluster: str = ""
    ) -> None:
        """A Service (of `cluster`), an endpoint set, a Node or a Pod (their keys name
        their cluster) went away."""
        ...

    def replace_all(
        self, services: Iterable[Service], endpoint_sets: Iterable[EndpointSet]
    ) -> None:
        """The registry is now exactly this, in every cluster (a file reload)."""
        ...

    def replace_cluster(
        self, cluster: str, services: Iterable[Service], endpoint_sets: Iterable[EndpointSet]
    ) -> None:
        """One cluster's part is now exactly this (empty: the cluster is gone)."""
        ...

    def upsert_peer_authentication(self, policy: PeerAuthentication) -> None:
        """A PeerAuthentication (of the local cluster, or the file) was added or changed."""
        ...

    def delete_peer_authentication(self, key: PeerAuthenticationKey) -> None: ...

    def replace_peer_authentications(self, policies: Iterable[PeerAuthentication]) -> None:
        """The PeerAuthentications are now exactly these (a file reload)."""
        ...

    def replace_pods(self, cluster: str | None, pods: Iterable[Pod]) -> None:
        """One cluster's Pods (None: every cluster's) are now exactly these."""
        ...
