"""The endpoint index: services and their endpoint sets, and what each update means.

Every update returns an `IndexChange` saying which services need a *full* push
(clusters changed: a service appeared, went away, or changed its ports) and
which need only an *endpoint* push (their ClusterLoadAssignments changed).
Content-equal updates change nothing. A service dropping to zero endpoints is
an endpoint change, never a full one.

Services of the same name and namespace from several clusters are one service
whose endpoint sets are every cluster's. Its ports are the `primary` (local)
cluster's, whole, where it has the service: a remote cluster, whoever controls
it, never adds, renumbers or removes a local Service's ports (Istio keeps the
first registry's service too). A service no primary copy has takes the union
of its copies' ports by name (where two give one name different numbers, the
first cluster id in order wins). A cluster adding a copy of a service already
known, with the same ports, changes no cluster.

The index also keeps each cluster's Nodes (their region and zone) and which
endpoint sets have endpoints on each, so that a Node's labels changing is an
endpoint change of exactly the services with endpoints there. An endpoint's
locality (`locality_of`): its zone is the slice's, else its Node's; its region
is its Node's, else its cluster's id (Istio's region-less fallback: endpoints
of a cluster without topology labels still form one locality per cluster, so
a proxy that names that cluster as its region prefers them).

Pods (auto mTLS): the index keeps each cluster's Pods by name and by IP, and
which endpoint sets have an endpoint at each (cluster, IP), so an endpoint finds
its pod (`pod_for`: does it run a sidecar, under which service account) the way
Istio does, by its object's owner reference, never by whoever claims its
address:
- an endpoint whose targetRef names a Pod is that pod's, and only if that pod
  exists in the endpoint set's own cluster and namespace and holds the
  endpoint's address (else it has no pod); a targetRef to another namespace's
  Pod gives it no pod (`NO_POD`, read so by the parser);
- an endpoint without one (no targetRef, or one to another kind) is the pod's
  at its address in the set's own cluster and namespace; where several claim
  it (a pod replaced faster than its old one went away), the first by name,
  whichever arrived first.
So a Pod claiming an IP never crosses clusters or namespaces and never overrides
a targetRef, and the answer depends on what the registry holds, not on the
order it arrived in. A service's service accounts (`service_accounts`: its
endpoints' pods', in every cluster, counted per (address, named pod) of each
endpoint set as they come and go, so no change recounts a whole service) name
the identities its clusters accept: a change of that set is a full change of
the service; a pod change that only turns an endpoint's sidecar on or off is an
endpoint change of the services whose endpoints it is; anything else of a pod
(its status, other labels) changes no service. A pod that came, went, moved
or changed its labels is a `workloads` change of its IPs: the sidecars there
may be selected by other PeerAuthentications (`pod_labels_in`: the labels of a
namespace's pods at an IP).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from pilot.registry.model import (
    NO_POD,
    Endpoint,
    EndpointSet,
    EndpointSetKey,
    Node,
    NodeKey,
    Pod,
    PodKey,
    Service,
    ServiceKey,
    ServicePort,
)
from pilot.xds.locality import Locality


@dataclass(frozen=True, slots=True)
class IndexChange:
    """Which services need clusters rebuilt (full) and which only endpoints; and the IPs
    whose pods came, went or changed their labels (`workloads`: their sidecars' policy)."""

    full: frozenset[ServiceKey] = frozenset()
    endpoints: frozenset[ServiceKey] = frozenset()
    workloads: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.full or self.endpoints or self.workloads)

    def merge(self, other: IndexChange) -> IndexChange:
        return IndexChange(
            self.full | other.full,
            self.endpoints | other.endpoints,
            self.workloads | other.workloads,
        )

    @staticmethod
    def union(changes: Iterable[IndexChange]) -> IndexChange:
        """All of them as one (in one pass: merging them pairwise copies quadratically)."""
        full: set[ServiceKey] = set()
        endpoints: set[ServiceKey] = set()
        workloads: set[str] = set()
        for change in changes:
            full |= change.full
            endpoints |= change.endpoints
            workloads |= change.workloads
        return IndexChange(frozenset(full), frozenset(endpoints), frozenset(workloads))


NO_CHANGE = IndexChange()
LEGACY = "Endpoints"  # the kind of a legacy endpoint set (EndpointSet.legacy)

Address = tuple[str, str]  # (cluster id, IP)
Identity = tuple[str, str]  # (namespace, service account)
View = tuple[bool, Identity]  # what an endpoint takes from its pod: sidecar or not, identity
# An endpoint set's claim on a pod: the set, one of its addresses, and the pod its endpoint
# there names (Endpoint.pod_name); counted once per set, however many endpoints repeat it.
Claim = tuple[EndpointSetKey, str, str | None]


@dataclass
class EndpointIndex:
    """service -> endpoint sets, plus the services themselves (merged across clusters)."""

    services: dict[ServiceKey, Service] = field(default_factory=dict)
    primary: str = ""  # the local cluster's id: its ports win a conflict
    _per_cluster: dict[ServiceKey, dict[str, Service]] = field(default_factory=dict)
    _sets: dict[EndpointSetKey, EndpointSet] = field(default_factory=dict)
    _by_service: dict[ServiceKey, set[EndpointSetKey]] = field(default_factory=dict)
    _nodes: dict[NodeKey, Node] = field(default_factory=dict)
    _sets_on_node: dict[NodeKey, set[EndpointSetKey]] = field(default_factory=dict)
    _pods: dict[PodKey, Pod] = field(default_factory=dict)
    _pods_at: dict[Address, tuple[PodKey, ...]] = field(default_factory=dict)  # sorted
    _pod_clusters: Counter[str] = field(default_factory=Counter)  # pods per cluster id
    # cluster -> IP -> the endpoint sets with an endpoint there (one key, the usual case,
    # held bare: an entry per endpoint address is the index's largest part).
    _sets_at: dict[str, dict[str, EndpointSetKey | set[EndpointSetKey]]] = field(
        default_factory=dict
    )
    # Each service's pods' identities, counted over the addresses of the endpoint sets
    # that feed it (so a change costs the addresses it moves, not the service's size),
    # and the set of them its clusters name.
    _counts: dict[ServiceKey, Counter[Identity]] = field(default_factory=dict)
    _accounts: dict[ServiceKey, frozenset[Identity]] = field(default_factory=dict)

    def endpoint_sets(self, service: ServiceKey) -> list[EndpointSet]:
        """The sets that feed a service's endpoints: per cluster, slices if it has any,
        else legacy Endpoints."""
        by_cluster: dict[str, list[EndpointSet]] = {}
        for key in sorted(self._by_service.get(service, ())):
            by_cluster.setdefault(key.cluster, []).append(self._sets[key])
        chosen: list[EndpointSet] = []
        for sets in by_cluster.values():
            modern = [s for s in sets if not s.legacy]
            chosen += modern or sets
        return chosen

    def clusters_of(self, service: ServiceKey) -> list[str]:
        """The clusters that have this service."""
        return sorted(self._per_cluster.get(service, {}))

    def upsert_service(self, service: Service) -> IndexChange:
        copies = self._per_cluster.setdefault(service.key, {})
        if copies.get(service.cluster) == service:
            return NO_CHANGE
        copies[service.cluster] = service
        return self._merge(service.key)

    def delete_service(self, key: ServiceKey, cluster: str = "") -> IndexChange:
        copies = self._per_cluster.get(key)
        if copies is None or copies.pop(cluster, None) is None:
            return NO_CHANGE
        if not copies:
            del self._per_cluster[key]
        return self._merge(key)

    def _merge(self, key: ServiceKey) -> IndexChange:
        """Make the merged service of `key` follow its copies; a full change if it moved."""
        copies = self._per_cluster.get(key)
        merged = _merged(key, copies, self.primary) if copies else None
        if merged == self.services.get(key):
            return NO_CHANGE
        if merged is None:
            del self.services[key]
        else:
            self.services[key] = merged
        return IndexChange(full=frozenset({key}))

    def upsert_endpoints(self, endpoint_set: EndpointSet) -> IndexChange:
        old = self._sets.get(endpoint_set.key)
        if old == endpoint_set:
            return NO_CHANGE
        owners = {endpoint_set.service} | ({old.service} if old else set())
        counted: set[ServiceKey] = set()
        self._replace_set(old, endpoint_set, counted)
        return self._settle(counted).merge(
            IndexChange.union(self._endpoint_change(service) for service in owners)
        )

    def delete_endpoints(self, key: EndpointSetKey) -> IndexChange:
        old = self._sets.get(key)
        if old is None:
            return NO_CHANGE
        counted: set[ServiceKey] = set()
        self._replace_set(old, None, counted)
        return self._settle(counted).merge(self._endpoint_change(old.service))

    def _replace_set(
        self, old: EndpointSet | None, new: EndpointSet | None, counted: set[ServiceKey]
    ) -> None:
        """Swap one endpoint set for another (either may be None), its identities too."""
        if old is not None:
            self._drop_set(old.key)
            self._leave(old, counted)
        if new is not None:
            self._put_set(new)
            self._enter(new, counted)

    def _put_set(self, endpoint_set: EndpointSet) -> None:
        self._sets[endpoint_set.key] = endpoint_set
        self._by_service.setdefault(endpoint_set.service, set()).add(endpoint_set.key)
        for node in _nodes_of(endpoint_set):
            self._sets_on_node.setdefault(node, set()).add(endpoint_set.key)
        self._link(endpoint_set)

    def _drop_set(self, key: EndpointSetKey) -> EndpointSet | None:
        old = self._sets.pop(key, None)
        if old is None:
            return None
        owned = self._by_service.get(old.service)
        if owned is not None:
            owned.discard(key)
            if not owned:
                del self._by_service[old.service]
        for node in _nodes_of(old):
            on_node = self._sets_on_node[node]
            on_node.discard(key)
            if not on_node:
                del self._sets_on_node[node]
        self._unlink(old)
        return old

    def _link(self, endpoint_set: EndpointSet) -> None:
        """Record the set at each of its addresses (a set without any leaves no table)."""
        ips = _ips_of(endpoint_set)
        if not ips:
            return
        at = self._sets_at.setdefault(endpoint_set.key.cluster, {})
        key = endpoint_set.key
        for ip in ips:
            held = at.get(ip)
            if held is None:
                at[ip] = key
            elif isinstance(held, set):
                held.add(key)
            elif held != key:
                at[ip] = {held, key}

    def _unlink(self, endpoint_set: EndpointSet) -> None:
        ips = _ips_of(endpoint_set)
        if not ips:
            return
        key = endpoint_set.key
        at = self._sets_at[key.cluster]
        for ip in ips:
            held = at[ip]
            if isinstance(held, set):
                held.discard(key)
                if len(held) == 1:
                    at[ip] = next(iter(held))
            else:
                del at[ip]
        if not at:
            del self._sets_at[key.cluster]

    def _sets_with(self, address: Address) -> tuple[EndpointSetKey, ...]:
        """The endpoint sets with an endpoint at (cluster, IP)."""
        cluster, ip = address
        held = self._sets_at.get(cluster, {}).get(ip)
        if held is None:
            return ()
        return tuple(held) if isinstance(held, set) else (held,)

    def upsert_node(self, node: Node) -> IndexChange:
        """A Node appeared or changed: its endpoints' services change if its locality did."""
        old = self._nodes.get(node.key)
        self._nodes[node.key] = node
        return self._node_change(node.key, old, node)

    def delete_node(self, key: NodeKey) -> IndexChange:
        return self._node_change(key, self._nodes.pop(key, None), None)

    def _node_change(self, key: NodeKey, old: Node | None, new: Node | None) -> IndexChange:
        if _labels(old) == _labels(new):
            return NO_CHANGE  # a Node's status or other labels changing moves no endpoint
        services = {self._sets[k].service for k in self._sets_on_node.get(key, ())}
        return IndexChange.union(self._endpoint_change(service) for service in services)

    # -- pods ----------------------------------------------------------------------

    def upsert_pod(self, pod: Pod) -> IndexChange:
        """A Pod appeared or changed; one that cannot be an endpoint's (done, or without
        an IP) is forgotten."""
        if not pod.serves_endpoints:
            return self.delete_pod(pod.key)
        old = self._pods.get(pod.key)
        if old == pod:
            return NO_CHANGE
        claims = self._claims_on(pod.key, _pod_addresses(old) | _pod_addresses(pod))
        before = {claim: self._view(*claim) for claim in claims}
        if old is not None:
            self._unclaim(old)
        else:
            self._pod_clusters[pod.key.cluster] += 1
        self._pods[pod.key] = pod
        for address in _pod_addresses(pod):
            self._pods_at[address] = tuple(sorted((*self._pods_at.get(address, ()), pod.key)))
        return self._pods_changed(before, _workload_moved(old, pod))

    def delete_pod(self, key: PodKey) -> IndexChange:
        old = self._pods.get(key)
        if old is None:
            return NO_CHANGE
        claims = self._claims_on(key, _pod_addresses(old))
        before = {claim: self._view(*claim) for claim in claims}
        self._unclaim(old)
        del self._pods[key]
        self._pod_clusters[key.cluster] -= 1
        if not self._pod_clusters[key.cluster]:
            del self._pod_clusters[key.cluster]
        return self._pods_changed(before, frozenset(old.ips))

    def replace_pods(self, cluster: str | None, pods: Iterable[Pod]) -> IndexChange:
        """Make one cluster's Pods (None: every cluster's) exactly these (a file reload, a
        cluster gone)."""
        wanted = {pod.key: pod for pod in pods if pod.serves_endpoints}
        held = [k for k in self._pods if cluster is None or k.cluster == cluster]
        changes = [self.delete_pod(key) for key in held if key not in wanted]
        changes += [self.upsert_pod(pod) for pod in wanted.values()]
        return IndexChange.union(changes)

    def services_at(self, ips: Iterable[str]) -> set[ServiceKey]:
        """The services with an endpoint at one of `ips`, in any cluster."""
        found: set[ServiceKey] = set()
        for cluster in list(self._sets_at):
            for ip in ips:
                for key in self._sets_with((cluster, ip)):
                    found.add(self._sets[key].service)
        return found

    def pod(self, key: PodKey) -> Pod | None:
        """A pod the index holds, by its key."""
        return self._pods.get(key)

    def pod_labels_in(self, namespace: str, ip: str) -> list[dict[str, str]]:
        """The labels of each pod of `namespace` at `ip`, in any cluster (a sidecar's own
        pod: never one of another namespace, whatever claims the IP there). Empty where
        none is known, or one's labels were not kept: which one it is cannot be told."""
        found = []
        for cluster in sorted(self._pod_clusters):
            for key in self._pods_at.get((cluster, ip), ()):
                if key.namespace != namespace:
                    continue
                labels = self._pods[key].labels
                if labels is None:
                    return []
                found.append(dict(labels))
        return found

    def pods_in(self, namespace: str, ip: str) -> list[Pod]:
        """The pods of `namespace` at `ip`, in any cluster (never another namespace's)."""
        return [
            self._pods[key]
            for cluster in sorted(self._pod_clusters)
            for key in self._pods_at.get((cluster, ip), ())
            if key.namespace == namespace
        ]

    def pod_for(self, key: EndpointSetKey, ip: str, pod_name: str | None) -> Pod | None:
        """The pod of set `key`'s endpoint at `ip` whose targetRef names `pod_name`
        (`Endpoint.pod_name`), if pilot knows it: see the module's rules."""
        if pod_name == NO_POD:
            return None
        # The pods holding `ip`, sorted by namespace and name: a named pod is its only if
        # it holds the endpoint's address, so it is among them too.
        for claimant in self._pods_at.get((key.cluster, ip), ()):
            if claimant.namespace == key.namespace and pod_name in (None, claimant.name):
                return self._pods[claimant]
        return None

    def runs_sidecar(self, key: EndpointSetKey, endpoint: Endpoint, ip: str) -> bool:
        """Whether the pod of set `key`'s `endpoint` at `ip` is labelled
        `security.istio.io/tlsMode: istio`."""
        pod = self.pod_for(key, ip, endpoint.pod_name)
        return pod is not None and pod.istio_mtls

    def service_accounts(self, service: ServiceKey) -> frozenset[Identity]:
        """The (namespace, service account) of every pod at the service's endpoints."""
        return self._accounts.get(service, frozenset())

    @property
    def pod_count(self) -> int:
        return len(self._pods)

    def _unclaim(self, pod: Pod) -> None:
        for address in _pod_addresses(pod):
            rest = tuple(k for k in self._pods_at.get(address, ()) if k != pod.key)
            if rest:
                self._pods_at[address] = rest
            else:
                self._pods_at.pop(address, None)

    def _claims_on(self, pod: PodKey, addresses: Iterable[Address]) -> list[Claim]:
        """The claims at `addresses` whose pod a change of `pod` can change: those of sets
        of its namespace naming it or naming none (no other can ever be its)."""
        claims: list[Claim] = []
        for address in addresses:
            ip = address[1]
            for key in self._sets_with(address):
                if key.namespace != pod.namespace:
                    continue
                for name in _names_at(self._sets[key], ip):
                    if name is None or name == pod.name:
                        claims.append((key, ip, name))
        return claims

    def _view(self, key: EndpointSetKey, ip: str, pod_name: str | None) -> View | None:
        """What set `key`'s endpoint at `ip` naming `pod_name` takes from its pod."""
        pod = self.pod_for(key, ip, pod_name)
        if pod is None:
            return None
        return pod.istio_mtls, (pod.key.namespace, pod.service_account)

    def _pods_changed(
        self, before: dict[Claim, View | None], workloads: frozenset[str] = frozenset()
    ) -> IndexChange:
        """What pod changes under these claims mean for the services making them (and for
        the sidecars at `workloads`, whose pod's labels moved)."""
        sidecar: set[ServiceKey] = set()
        counted: set[ServiceKey] = set()
        for claim, was in before.items():
            now = self._view(*claim)
            if now == was:
                continue
            endpoint_set = self._sets[claim[0]]
            if not self._feeds(endpoint_set):
                continue  # legacy Endpoints hidden by slices: nothing served moves
            if _sidecar(now) != _sidecar(was):
                sidecar.add(endpoint_set.service)
            self._bump(endpoint_set.service, _identity(was), -1, counted)
            self._bump(endpoint_set.service, _identity(now), 1, counted)
        changes = [self._settle(counted), IndexChange(workloads=workloads)]
        changes += [self._endpoint_change(service) for service in sorted(sidecar)]
        return IndexChange.union(changes)

    # -- counting identities ----------------------------------------------------------
    # A service's endpoints are, per cluster, its slices' if it has any, else its legacy
    # Endpoints' (`endpoint_sets`): a slice arriving hides legacy sets of its cluster, the
    # last slice going shows them again.

    def _has_slices(self, service: ServiceKey, cluster: str, besides: EndpointSetKey) -> bool:
        return any(
            k.cluster == cluster and k.kind != LEGACY and k != besides
            for k in self._by_service.get(service, ())
        )

    def _legacy_sets(self, service: ServiceKey, cluster: str) -> list[EndpointSet]:
        return [
            self._sets[k]
            for k in self._by_service.get(service, ())
            if k.cluster == cluster and k.kind == LEGACY
        ]

    def _feeds(self, endpoint_set: EndpointSet) -> bool:
        """Whether a set (in the index) feeds its service's endpoints."""
        key = endpoint_set.key
        return not endpoint_set.legacy or not self._has_slices(
            endpoint_set.service, key.cluster, key
        )

    def _enter(self, endpoint_set: EndpointSet, counted: set[ServiceKey]) -> None:
        """Count a set just put in the index (a first slice uncounts the legacy sets)."""
        service, key = endpoint_set.service, endpoint_set.key
        if endpoint_set.legacy:
            if not self._has_slices(service, key.cluster, key):
                self._count(endpoint_set, 1, counted)
            return
        if not self._has_slices(service, key.cluster, key):
            for legacy in self._legacy_sets(service, key.cluster):
                self._count(legacy, -1, counted)
        self._count(endpoint_set, 1, counted)

    def _leave(self, endpoint_set: EndpointSet, counted: set[ServiceKey]) -> None:
        """Uncount a set just taken out of the index (the last slice counts legacy again)."""
        service, key = endpoint_set.service, endpoint_set.key
        if endpoint_set.legacy:
            if not self._has_slices(service, key.cluster, key):
                self._count(endpoint_set, -1, counted)
            return
        self._count(endpoint_set, -1, counted)
        if not self._has_slices(service, key.cluster, key):
            for legacy in self._legacy_sets(service, key.cluster):
                self._count(legacy, 1, counted)

    def _count(self, endpoint_set: EndpointSet, sign: int, counted: set[ServiceKey]) -> None:
        key = endpoint_set.key
        for ip, name in _claims_of(endpoint_set):
            self._bump(endpoint_set.service, _identity(self._view(key, ip, name)), sign, counted)

    def _bump(
        self, service: ServiceKey, identity: Identity | None, sign: int, counted: set[ServiceKey]
    ) -> None:
        """One address of `service` more (or less) with this identity; `counted` collects
        the services whose set of identities may have moved."""
        if identity is None:
            return
        counts = self._counts.setdefault(service, Counter())
        left = counts[identity] + sign
        if left > 0:
            counts[identity] = left
        else:
            del counts[identity]
            if not counts:
                del self._counts[service]
        if left in (0, 1):
            counted.add(service)

    def _settle(self, counted: Iterable[ServiceKey]) -> IndexChange:
        """A full change of each service whose set of identities ended up different."""
        full = set()
        for service in counted:
            accounts = frozenset(self._counts.get(service, ()))
            if accounts == self._accounts.get(service, frozenset()):
                continue
            if accounts:
                self._accounts[service] = accounts
            else:
                del self._accounts[service]
            if service in self.services:
                full.add(service)
        return IndexChange(full=frozenset(full), endpoints=frozenset(full)) if full else NO_CHANGE

    def locality_of(self, cluster: str, endpoint: Endpoint) -> Locality:
        """Where an endpoint is: the slice's zone, else its Node's; its Node's region, else
        its cluster id."""
        node = self._nodes.get(NodeKey(cluster, endpoint.node_name)) if endpoint.node_name else None
        region, zone = _labels(node)
        return Locality(region or cluster, endpoint.zone or zone)

    def replace_all(
        self, services: Iterable[Service], endpoint_sets: Iterable[EndpointSet]
    ) -> IndexChange:
        """Make the index equal to a full state (a file reload): apply the diff."""
        return self._replace(None, services, endpoint_sets)

    def replace_cluster(
        self, cluster: str, services: Iterable[Service], endpoint_sets: Iterable[EndpointSet]
    ) -> IndexChange:
        """Make one cluster's part of the index equal to this (nothing: the cluster is gone,
        and its Nodes are forgotten too); the other clusters' parts stay as they are."""
        change = self._replace(cluster, services, endpoint_sets)
        if not self.has_cluster(cluster):
            for key in [k for k in self._nodes if k.cluster == cluster]:
                del self._nodes[key]  # no endpoint of the cluster is left to place
        return change

    def has_cluster(self, cluster: str) -> bool:
        """Whether any service or endpoint set of the index came from `cluster`."""
        return any(cluster in copies for copies in self._per_cluster.values()) or any(
            key.cluster == cluster for key in self._sets
        )

    def _replace(
        self, cluster: str | None, services: Iterable[Service], endpoint_sets: Iterable[EndpointSet]
    ) -> IndexChange:
        wanted_services = {(s.key, s.cluster): s for s in services}
        wanted_sets = {s.key: s for s in endpoint_sets}
        held = [
            (key, at)
            for key, copies in self._per_cluster.items()
            for at in copies
            if cluster is None or at == cluster
        ]
        held_sets = [k for k in self._sets if cluster is None or k.cluster == cluster]
        gone = set(held) - set(wanted_services)
        changes = [self.delete_service(key, at) for key, at in gone]
        changes += [self.upsert_service(service) for service in wanted_services.values()]
        # Endpoint sets move first and their services' accounts are recounted once after:
        # a slice renamed in a reload is no full change of its service.
        owners: set[ServiceKey] = set()
        counted: set[ServiceKey] = set()
        for key in set(held_sets) - set(wanted_sets):
            owners.add(self._sets[key].service)
            self._replace_set(self._sets[key], None, counted)
        for endpoint_set in wanted_sets.values():
            old = self._sets.get(endpoint_set.key)
            if old == endpoint_set:
                continue
            owners |= {endpoint_set.service} | ({old.service} if old else set())
            self._replace_set(old, endpoint_set, counted)
        changes.append(self._settle(counted))
        changes += [self._endpoint_change(service) for service in owners]
        return IndexChange.union(changes)

    def _endpoint_change(self, service: ServiceKey) -> IndexChange:
        if service not in self.services:
            return NO_CHANGE  # endpoints of an unknown service matter once it appears
        return IndexChange(endpoints=frozenset({service}))


def _merged(key: ServiceKey, copies: dict[str, Service], primary: str) -> Service:
    """One service from its copies in several clusters: the primary's ports if it has
    the service, else every copy's by name, the first cluster id's first."""
    if primary in copies:
        return Service(key, copies[primary].ports, cluster_ip=copies[primary].cluster_ip)
    order = sorted(copies)
    ports: dict[str, ServicePort] = {}
    for cluster in order:
        for port in copies[cluster].ports:
            ports.setdefault(port.name, port)
    first = copies[order[0]].ports  # kept whole, as a single cluster's service is served
    merged_ports = (*first, *(port for port in ports.values() if port not in first))
    return Service(key, merged_ports, cluster_ip=copies[order[0]].cluster_ip)


def _nodes_of(endpoint_set: EndpointSet) -> set[NodeKey]:
    """The Nodes an endpoint set's endpoints run on."""
    cluster = endpoint_set.key.cluster
    return {
        NodeKey(cluster, endpoint.node_name)
        for group in endpoint_set.groups
        for endpoint in group.endpoints
        if endpoint.node_name
    }


def _ips_of(endpoint_set: EndpointSet) -> set[str]:
    """The IP of every endpoint of a set (of its cluster), ready or not."""
    return {
        address
        for group in endpoint_set.groups
        for endpoint in group.endpoints
        for address in endpoint.addresses
    }


def _workload_moved(old: Pod | None, new: Pod) -> frozenset[str]:
    """The IPs whose sidecar may select other policies: the pod came, moved or relabelled."""
    if old is not None and old.ips == new.ips and old.labels == new.labels:
        return frozenset()
    return frozenset(new.ips) | (frozenset(old.ips) if old is not None else frozenset())


def _claims_of(endpoint_set: EndpointSet) -> set[tuple[str, str | None]]:
    """Each (address, the pod its endpoint names) of a set, once."""
    return {
        (address, endpoint.pod_name)
        for group in endpoint_set.groups
        for endpoint in group.endpoints
        for address in endpoint.addresses
    }


def _names_at(endpoint_set: EndpointSet, ip: str) -> set[str | None]:
    """The pods a set's endpoints at `ip` name (one, but for a set listing it twice)."""
    return {
        endpoint.pod_name
        for group in endpoint_set.groups
        for endpoint in group.endpoints
        if ip in endpoint.addresses
    }


def _pod_addresses(pod: Pod | None) -> set[Address]:
    return {(pod.key.cluster, ip) for ip in pod.ips} if pod is not None else set()


def _sidecar(view: View | None) -> bool:
    return view is not None and view[0]


def _identity(view: View | None) -> Identity | None:
    return view[1] if view is not None else None


def _labels(node: Node | None) -> tuple[str, str]:
    return (node.region, node.zone) if node is not None else ("", "")
