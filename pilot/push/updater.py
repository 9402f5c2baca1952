"""The registry updater sources are given: index update, then a push request.

Every change is applied to the endpoint index, which says what it means; a
change that needs a push enters the pipeline's debounce as a `PushRequest`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pilot.push.request import PushRequest
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


class IndexUpdater:
    """Implements `RegistryUpdater` on the endpoint index, submitting what changed."""

    def __init__(
        self,
        index: EndpointIndex,
        submit: Callable[[PushRequest], None],
        stats: XdsStats,
        policies: PeerAuthentications | None = None,
    ) -> None:
        self._index = index
        self._submit = submit
        self._stats = stats
        self.policies = policies if policies is not None else PeerAuthentications()

    def upsert(self, obj: Service | EndpointSet | Node | Pod) -> None:
        if isinstance(obj, Service):
            self._changed(self._index.upsert_service(obj))
        elif isinstance(obj, Node):
            self._changed(self._index.upsert_node(obj))
        elif isinstance(obj, Pod):
            self._changed(self._index.upsert_pod(obj))
        else:
            self._changed(self._index.upsert_endpoints(obj))

    def delete(
        self, key: ServiceKey | EndpointSetKey | NodeKey | PodKey, cluster: str = ""
    ) -> None:
        if isinstance(key, ServiceKey):
            self._changed(self._index.delete_service(key, cluster))
        elif isinstance(key, NodeKey):
            self._changed(self._index.delete_node(key))
        elif isinstance(key, PodKey):
            self._changed(self._index.delete_pod(key))
        else:
            self._changed(self._index.delete_endpoints(key))

    def replace_all(
        self, services: Iterable[Service], endpoint_sets: Iterable[EndpointSet]
    ) -> None:
        self._changed(self._index.replace_all(services, endpoint_sets))

    def replace_cluster(
        self, cluster: str, services: Iterable[Service], endpoint_sets: Iterable[EndpointSet]
    ) -> None:
        self._changed(self._index.replace_cluster(cluster, services, endpoint_sets))

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
            self._submit(PushRequest(mtls_namespaces=namespaces))

    def replace_pods(self, cluster: str | None, pods: Iterable[Pod]) -> None:
        self._changed(self._index.replace_pods(cluster, pods))

    def _changed(self, change: IndexChange) -> None:
        if not change:
            return
        self._stats.inbound_updates["svc"] += len(change.full)
        self._stats.inbound_updates["eds"] += len(change.endpoints)
        self._stats.inbound_updates["workload"] += len(change.workloads)
        self._submit(PushRequest(registry=change))
