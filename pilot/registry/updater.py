"""The one way sources change the registry, and its implementation on the endpoint index.

The file source replaces everything with each good version of the file; the
Kubernetes informers upsert and delete objects as they change, one method per
kind. `IndexUpdater` applies each change to the endpoint index, which says what
it means (nothing, endpoints only, or full), and hands that to a `ChangeSink`
(the push pipeline, through `pilot.push.request.RequestSink`), so a source never
knows who listens and the registry never knows what a push is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from pilot.registry.index import EndpointIndex, IndexChange
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
from pilot.registry.peer_authentication import (
    PeerAuthentication,
    PeerAuthenticationKey,
    PeerAuthentications,
)
from pilot.stats import XdsStats


class RegistryUpdater(Protocol):
    """Changes to the registry, as sources make them."""

    def upsert_service(self, service: Service) -> None: ...

    def delete_service(self, key: ServiceKey, cluster: str = "") -> None:
        """The Service of `cluster` went away."""
        ...

    def upsert_endpoints(self, endpoints: EndpointSet) -> None: ...

    def delete_endpoints(self, key: EndpointSetKey) -> None: ...

    def upsert_node(self, node: Node) -> None:
        """A Node was added or relabelled (its locality)."""
        ...

    def delete_node(self, key: NodeKey) -> None: ...

    def upsert_pod(self, pod: Pod) -> None: ...

    def delete_pod(self, key: PodKey) -> None: ...

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


class ChangeSink(Protocol):
    """Where what a change means goes (in pilot, the push pipeline)."""

    def registry_changed(self, change: IndexChange) -> None: ...

    def policies_changed(self, namespaces: frozenset[str]) -> None:
        """The PeerAuthentications of these namespaces moved."""
        ...


class IndexUpdater:
    """`RegistryUpdater` on the endpoint index: each change applied, what it means sunk."""

    def __init__(
        self,
        index: EndpointIndex,
        sink: ChangeSink,
        stats: XdsStats,
        policies: PeerAuthentications | None = None,
    ) -> None:
        self._index = index
        self._sink = sink
        self._stats = stats
        self.policies = policies if policies is not None else PeerAuthentications()

    def upsert_service(self, service: Service) -> None:
        self._changed(self._index.upsert_service(service))

    def delete_service(self, key: ServiceKey, cluster: str = "") -> None:
        self._changed(self._index.delete_service(key, cluster))

    def upsert_endpoints(self, endpoints: EndpointSet) -> None:
        self._changed(self._index.upsert_endpoints(endpoints))

    def delete_endpoints(self, key: EndpointSetKey) -> None:
        self._changed(self._index.delete_endpoints(key))

    def upsert_node(self, node: Node) -> None:
        self._changed(self._index.upsert_node(node))

    def delete_node(self, key: NodeKey) -> None:
        self._changed(self._index.delete_node(key))

    def upsert_pod(self, pod: Pod) -> None:
        self._changed(self._index.upsert_pod(pod))

    def delete_pod(self, key: PodKey) -> None:
        self._changed(self._index.delete_pod(key))

    def replace_all(
        self, services: Iterable[Service], endpoint_sets: Iterable[EndpointSet]
    ) -> None:
        self._changed(self._index.replace_all(services, endpoint_sets))

    def replace_cluster(
        self, cluster: str, services: Iterable[Service], endpoint_sets: Iterable[EndpointSet]
    ) -> None:
        self._changed(self._index.replace_cluster(cluster, services, endpoint_sets))

    def replace_pods(self, cluster: str | None, pods: Iterable[Pod]) -> None:
        self._changed(self._index.replace_pods(cluster, pods))

    def upsert_peer_authentication(self, policy: PeerAuthentication) -> None:
        self._moved(self.policies.upsert(policy))

    def delete_peer_authentication(self, key: PeerAuthenticationKey) -> None:
        self._moved(self.policies.delete(key))

    def replace_peer_authentications(self, policies: Iterable[PeerAuthentication]) -> None:
        self._moved(self.policies.replace_all(policies))

    def _moved(self, namespaces: frozenset[str]) -> None:
        """Namespaces whose policies moved: their sidecars' inbound listeners may change."""
        if namespaces:
            self._stats.inbound_updates["peerauthentication"] += len(namespaces)
            self._sink.policies_changed(namespaces)

    def _changed(self, change: IndexChange) -> None:
        if not change:
            return
        self._stats.inbound_updates["svc"] += len(change.full)
        self._stats.inbound_updates["eds"] += len(change.endpoints)
        self._stats.inbound_updates["workload"] += len(change.workloads)
        self._sink.registry_changed(change)
