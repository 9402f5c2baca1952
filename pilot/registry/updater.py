"""The one way sources change the registry, and its implementation on the endpoint index.

The file source replaces everything with each good version of the file; the
Kubernetes informers upsert and delete objects as they change, one method per
kind. `IndexUpdater` applies each change to the endpoint index, which says what
it means (nothing, endpoints only, or full), and hands that to a `ChangeSink`
(the push pipeline, through `pilot.push.request.RequestSink`), so a source never
knows who listens and the registry never knows what a push is.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from pilot.registry.authorization_policy import AuthorizationPolicies, AuthorizationPolicy
from pilot.registry.index import EndpointIndex, IndexChange
from pilot.registry.istio_config import ConfigKey
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
from pilot.registry.request_authentication import RequestAuthentication, RequestAuthentications
from pilot.registry.traffic_config import Config, TrafficConfig
from pilot.stats import XdsStats

log = logging.getLogger("pilot.registry")


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

    def upsert_authorization_policy(self, policy: AuthorizationPolicy) -> None:
        """An AuthorizationPolicy (of the local cluster, or the file) was added or changed."""
        ...

    def delete_authorization_policy(self, key: ConfigKey) -> None: ...

    def replace_authorization_policies(self, policies: Iterable[AuthorizationPolicy]) -> None:
        """The AuthorizationPolicies are now exactly these (a file reload)."""
        ...

    def upsert_request_authentication(self, ra: RequestAuthentication) -> None:
        """A RequestAuthentication (of the local cluster, or the file) was added or changed."""
        ...

    def delete_request_authentication(self, key: ConfigKey) -> None: ...

    def replace_request_authentications(
        self, objects: Iterable[RequestAuthentication], refused: Iterable[ConfigKey]
    ) -> None:
        """The RequestAuthentications are now these, plus the last good version of each
        refused one (a file reload)."""
        ...

    def upsert_config(self, config: Config) -> None:
        """A DestinationRule or VirtualService was added or changed."""
        ...

    def delete_config(self, key: ConfigKey) -> None: ...

    def config_refused(self, key: ConfigKey) -> None:
        """An object was refused as invalid (counted; its last good version stays)."""
        ...

    def upsert_unsupported(self, key: ConfigKey) -> None:
        """An object of an Istio kind pilot does not implement (counted and listed)."""
        ...

    def replace_traffic(
        self,
        configs: Iterable[Config],
        unsupported: Iterable[ConfigKey],
        refused: Iterable[ConfigKey],
    ) -> None:
        """The traffic objects are now these, plus the last good version of each refused
        one (a file reload)."""
        ...


class ChangeSink(Protocol):
    """Where what a change means goes (in pilot, the push pipeline)."""

    def registry_changed(self, change: IndexChange) -> None: ...

    def policies_changed(self, namespaces: frozenset[str]) -> None:
        """The PeerAuthentications or AuthorizationPolicies of these namespaces moved."""
        ...

    def routes_changed(self, services: frozenset[ServiceKey]) -> None:
        """The VirtualServices of these services moved (their routes alone)."""
        ...


class IndexUpdater:
    """`RegistryUpdater` on the endpoint index: each change applied, what it means sunk."""

    def __init__(
        self,
        index: EndpointIndex,
        sink: ChangeSink,
        stats: XdsStats,
        policies: PeerAuthentications | None = None,
        traffic: TrafficConfig | None = None,
        *,
        authz: AuthorizationPolicies | None = None,
        jwt: RequestAuthentications | None = None,
    ) -> None:
        self._index = index
        self._sink = sink
        self._stats = stats
        self.policies = policies if policies is not None else PeerAuthentications()
        self.traffic = traffic if traffic is not None else TrafficConfig()
        self.authz = authz if authz is not None else AuthorizationPolicies()
        self.jwt = jwt if jwt is not None else RequestAuthentications()

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

    def upsert_authorization_policy(self, policy: AuthorizationPolicy) -> None:
        moved = self.authz.upsert(policy)
        if moved:
            self._warn_failing_closed([policy])
        self._authz_moved(moved)

    def delete_authorization_policy(self, key: ConfigKey) -> None:
        self._authz_moved(self.authz.delete(key))

    def replace_authorization_policies(self, policies: Iterable[AuthorizationPolicy]) -> None:
        policies = list(policies)
        before = {p.key: p for p in self.authz.objects()}
        self._warn_failing_closed(p for p in policies if before.get(p.key) != p)
        self._authz_moved(self.authz.replace_all(policies))

    def _warn_failing_closed(self, policies: Iterable[AuthorizationPolicy]) -> None:
        """One line per policy enforced stricter than written, and the counter."""
        for policy in policies:
            if policy.fail_closed:
                self._stats.authz_failed_closed += 1
                log.warning("%s fails closed: %s", policy.key, "; ".join(policy.fail_closed))

    def _authz_moved(self, namespaces: frozenset[str]) -> None:
        if namespaces:
            self._stats.inbound_updates["authorizationpolicy"] += len(namespaces)
            self._sink.policies_changed(namespaces)

    def upsert_request_authentication(self, ra: RequestAuthentication) -> None:
        moved = self.jwt.upsert(ra)
        if moved:
            self._warn_targeted([ra])
        self._jwt_moved(moved)

    def delete_request_authentication(self, key: ConfigKey) -> None:
        self._jwt_moved(self.jwt.delete(key))

    def replace_request_authentications(
        self, objects: Iterable[RequestAuthentication], refused: Iterable[ConfigKey]
    ) -> None:
        objects, refused = list(objects), list(refused)
        for key in refused:
            self.config_refused(key)
        before = {ra.key: ra for ra in self.jwt.objects()}
        self._warn_targeted(ra for ra in objects if before.get(ra.key) != ra)
        self._jwt_moved(self.jwt.replace_all(objects, refused))

    @staticmethod
    def _warn_targeted(objects: Iterable[RequestAuthentication]) -> None:
        for ra in objects:
            if ra.targeted:
                log.warning(
                    "%s names targetRef(s) (a gateway or waypoint): it applies to no sidecar,"
                    " and its issuers give no request principal",
                    ra.key,
                )

    def _jwt_moved(self, namespaces: frozenset[str]) -> None:
        if namespaces:
            self._stats.inbound_updates["requestauthentication"] += len(namespaces)
            self._sink.policies_changed(namespaces)

    def upsert_config(self, config: Config) -> None:
        self._stats.inbound_updates["config"] += 1  # Istio's type for config objects
        self._hosts_moved(self.traffic.upsert(config))

    def delete_config(self, key: ConfigKey) -> None:
        self._stats.inbound_updates["config"] += 1
        self._hosts_moved(self.traffic.delete(key))

    def config_refused(self, key: ConfigKey) -> None:
        self._stats.config_rejected[key.kind] += 1

    def upsert_unsupported(self, key: ConfigKey) -> None:
        self._warn_unsupported(self.traffic.upsert_unsupported(key))

    def _warn_unsupported(self, kinds: set[str]) -> None:
        for kind in sorted(kinds):
            log.warning(
                "%s objects are not implemented by pilot: they are counted"
                " (pilot_config_unsupported) and listed on /debug, and change nothing",
                kind,
            )

    def replace_traffic(
        self,
        configs: Iterable[Config],
        unsupported: Iterable[ConfigKey],
        refused: Iterable[ConfigKey],
    ) -> None:
        refused = list(refused)
        for key in refused:
            self.config_refused(key)
        self._hosts_moved(self.traffic.replace_all(configs, unsupported, refused))
        self._warn_unsupported(self.traffic.new_unsupported_kinds())

    def _hosts_moved(self, hosts: set[str]) -> None:
        """Traffic objects of these hosts moved: their services' clusters are rebuilt (the
        cache then sends only the clusters and assignments whose bytes changed); the
        services whose VirtualServices moved get their routes rebuilt, nothing else."""
        routes = self.traffic.take_route_hosts()
        if routes:
            moved = self.traffic.services_of(routes, self._index.services)
            if moved:
                self._sink.routes_changed(frozenset(moved))
        if not hosts:
            return
        services = self.traffic.services_of(hosts, self._index.services)
        if services:
            self._sink.registry_changed(IndexChange(full=frozenset(services)))

    def _moved(self, namespaces: frozenset[str]) -> None:
        """Namespaces whose policies moved: their sidecars' inbound listeners may change."""
        if namespaces:
            self._stats.inbound_updates["peerauthentication"] += len(namespaces)
            self._sink.policies_changed(namespaces)

    def _changed(self, change: IndexChange) -> None:
        if not change:
            return
        if change.workloads and self.traffic.has_subsets():
            change = self._with_subset_members(change)
        self._stats.inbound_updates["svc"] += len(change.full)
        self._stats.inbound_updates["eds"] += len(change.endpoints)
        self._stats.inbound_updates["workload"] += len(change.workloads)
        self._sink.registry_changed(change)

    def _with_subset_members(self, change: IndexChange) -> IndexChange:
        """Pods that came, went or were relabelled may move in or out of subsets: the
        services with endpoints at their IPs that have subsets get their endpoints rebuilt."""
        touched = {
            service
            for service in self._index.services_at(change.workloads)
            if self.traffic.subsets_for(service)
        }
        extra = frozenset(touched) - change.full - change.endpoints
        if not extra:
            return change
        return change.merge(IndexChange(endpoints=extra))
