"""The inbound generator: each sidecar's own `virtualInbound` and `inbound|P||` clusters.

A sidecar's inbound side depends on three things: its IP (the second field of
its node id, `sidecar~IP~POD.NS~NS.svc.cluster.local`), the target ports of
the services whose endpoints include that IP (their protocol from the service
port; never one of the sidecar's own, `pilot.builders.proxy_ports`), and the
mTLS modes PeerAuthentication gives its workload and each port (from its
namespace, the mesh, and the workload policy that selects its own Pod: the Pod
of its namespace at its IP, never another namespace's). Those make its
`InboundShape`; the listener and clusters are a function of the shape alone,
so each shape is built and serialized once, into a cache table of its own
(listeners: one per shape; clusters: one per port set), and every proxy of that
shape reads the same bytes through an overlay (`ResourceCache.set_overlay`)
laid over the REDIRECT listener flavor and the ADS_WITH_LISTENERS cluster
flavor: streams that read no listeners, or in INTERCEPTION_MODE NONE (nothing
is captured there, and the app is reached directly), get none of it.

Whose services: only those of the sidecar's own namespace (the one below).
As in Istio, where a proxy's inbound side comes from the Services that select
its pod (and a Service selects pods of its own namespace only), an
EndpointSlice of another namespace naming the pod's address adds no port to it
and changes no port's protocol.

Which namespace: the one the proxy *proved* (its SPIFFE identity's), when it
proved one; else its node id's. Where workload policies exist there and its Pod
is not known (or several Pods of the namespace claim its IP), it gets the
strictest modes they could give (failing closed), with a warning (at most
`MAX_FAILED_CLOSED_LOGGED` proxies said) and a counter (`failed_closed`).
Either way the namespace only picks which of the few shapes this proxy reads:
nothing another proxy reads changes, so a node claiming another pod's IP or
namespace can learn ports it could read from services anyway, and weaken
nothing but its own inbound side, which its own Envoy decides anyway.

Bounded: a shape exists while some connected proxy reads it (dropped with the
last one), and a shape is made of what the registry says (ports of services,
PeerAuthentication modes), never of what a node claims beyond its IP and
namespace: at most one shape per connected sidecar, and at most
(the distinct port sets of the registry's (endpoint IP, namespace) pairs, plus
the empty one) x (the distinct modes the policies give) in all.

What a change touches: an endpoint set whose addresses or ports moved, the
ports of a service (its IPs), a pod's labels (its IPs), a namespace's policies
(PeerAuthentication, AuthorizationPolicy, RequestAuthentication). Only the proxies
at those IPs or in those namespaces are reconsidered, and only those whose shape
changed get anything (`Changes.owned`: LDS, CDS when the port set or the `jwksUri`
clusters changed: those are the shape's cluster table too). While no sidecar is
attached, a change is only noted (which services), and followed when the first one
attaches.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from pilot.builders.inbound import (
    INBOUND_PASSTHROUGH_CLUSTER,
    VIRTUAL_INBOUND,
    InboundProtocol,
    InboundShape,
    inbound_cluster,
    inbound_cluster_name,
    inbound_passthrough_cluster,
    inbound_protocol,
    virtual_inbound,
)
from pilot.builders.jwt_authn import jwks_cluster
from pilot.builders.path_normalization import PathNormalization
from pilot.builders.proxy_ports import reserved
from pilot.logs import clipped
from pilot.push.request import Changes, PushRequest
from pilot.registry.authorization_policy import AppliedPolicies, AuthorizationPolicies
from pilot.registry.index import EndpointIndex
from pilot.registry.jwks import JwksUri
from pilot.registry.model import EndpointPort, EndpointSet, EndpointSetKey, ServiceKey
from pilot.registry.peer_authentication import Labels, PeerAuthentications, WorkloadModes
from pilot.registry.request_authentication import (
    AppliedAuthentications,
    RequestAuthentications,
)
from pilot.security.identity import Identity
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import ADS_WITH_LISTENERS
from pilot.xds.interception import Interception
from pilot.xds.proxy import ProxyKey
from pilot.xds.resource import Resource

log = logging.getLogger("pilot.xds")
MAX_FAILED_CLOSED_LOGGED = 64  # distinct (IP, namespace) whose failing closed is said

SIDECAR_PREFIX = "sidecar~"
# Who reads the overlays: streams whose traffic is captured (REDIRECT listeners), and of
# those, for clusters, the ADS streams that read listeners (the ones that name them).
_LISTENERS_WHEN = {types.LISTENER: Interception.REDIRECT.value}
_CLUSTERS_WHEN = {types.CLUSTER: ADS_WITH_LISTENERS, types.LISTENER: Interception.REDIRECT.value}
Ports = tuple[tuple[int, InboundProtocol], ...]
# What a sidecar's inbound clusters are made of: its ports and its remote JWKS URIs.
ClusterKey = tuple[Ports, tuple[JwksUri, ...]]
# An endpoint set's addresses, each with the ports of the group(s) listing it.
AddressPorts = dict[str, tuple[EndpointPort, ...]]


def sidecar_of(node_id: str) -> tuple[str, str] | None:
    """(IP, namespace) of a sidecar's node id; None when it is no sidecar's."""
    if not node_id.startswith(SIDECAR_PREFIX):
        return None
    parts = node_id.split("~")
    if len(parts) != 4 or not parts[1]:
        return None
    namespace = parts[3].split(".", 1)[0]
    return parts[1], namespace


def namespace_of(proxy: ProxyKey, claimed: str) -> str:
    """The namespace that decides a proxy's mode: its proven identity's, else its claim."""
    if proxy.identity is not None:
        try:
            return Identity.parse(proxy.identity).namespace
        except ValueError:
            pass
    return claimed


@dataclass(slots=True)
class _Table:
    """One shape's cache table: its flavor name and how many proxies read it."""

    flavor: str
    readers: int = 0


@dataclass(slots=True)
class _Held:
    """One serialized cluster and the number of tables holding it."""

    resource: Resource
    tables: int = 0


@dataclass(frozen=True, slots=True)
class _Sidecar:
    """What one attached proxy reads: its shape, and where its shape comes from."""

    ip: str
    namespace: str
    shape: InboundShape


def _clusters_of(shape: InboundShape) -> ClusterKey:
    return shape.ports, shape.jwt.jwks_uris


class InboundGenerator:
    """Per-proxy inbound listener and clusters, shared by shape."""

    type_urls = frozenset({types.LISTENER, types.CLUSTER})

    def __init__(
        self,
        index: EndpointIndex,
        cache: ResourceCache,
        policies: PeerAuthentications,
        stats: XdsStats,
        authz: AuthorizationPolicies | None = None,
        *,
        normalization: PathNormalization = PathNormalization.BASE,
        jwt: RequestAuthentications | None = None,
    ) -> None:
        self._index = index
        self._normalization = normalization
        self._cache = cache
        self._policies = policies
        self._authz = authz if authz is not None else AuthorizationPolicies()
        self._jwt = jwt if jwt is not None else RequestAuthentications()
        self._stats = stats
        self._ids = itertools.count(1)
        self._sidecars: dict[ProxyKey, _Sidecar] = {}
        self._at_ip: dict[str, set[ProxyKey]] = {}  # attached proxies, by IP
        self._listeners: dict[InboundShape, _Table] = {}
        self._clusters: dict[ClusterKey, _Table] = {}
        # Each inbound cluster, serialized once, with how many cluster tables hold it.
        self._cluster_resources: dict[tuple[int, InboundProtocol] | JwksUri | None, _Held] = {}
        # Where each endpoint set's addresses are, as last seen (the same object: unchanged).
        self._sets: dict[EndpointSetKey, tuple[EndpointSet, AddressPorts]] = {}
        self._sets_of: dict[ServiceKey, set[EndpointSetKey]] = {}
        self._sets_at: dict[str, set[EndpointSetKey]] = {}  # address -> sets listing it
        # Services changed while no sidecar was attached: followed when one attaches, so
        # a registry without sidecars (gateways, CDS/EDS clients) costs nothing per change.
        self._unfollowed: set[ServiceKey] = set()
        self.failed_closed = 0  # shapes given the strictest modes (workload unknown)
        self._warned: set[tuple[str, str, str]] = set()
        # During one build: the modes of each (namespace, pods' labels) asked, so that a
        # namespace's policy change costs its distinct workloads, not its proxies.
        self._modes_seen: dict[tuple[str, tuple[Labels, ...]], WorkloadModes] = {}
        self._authz_seen: dict[tuple[str, tuple[Labels, ...]], AppliedPolicies] = {}
        self._jwt_seen: dict[tuple[str, tuple[Labels, ...]], AppliedAuthentications] = {}

    # -- what the pipeline asks ------------------------------------------------

    @property
    def shapes(self) -> int:
        """Listener shapes held (for tests and the operator): one table each."""
        return len(self._listeners)

    def attach(self, proxy: ProxyKey) -> None:
        where = sidecar_of(proxy.node_id)
        if where is None:
            return
        ip, claimed = where
        self._follow_all()
        namespace = namespace_of(proxy, claimed)
        sidecar = _Sidecar(ip, namespace, self._shape(ip, namespace, proxy))
        self._modes_seen.clear()
        self._authz_seen.clear()
        self._jwt_seen.clear()
        self._sidecars[proxy] = sidecar
        self._at_ip.setdefault(ip, set()).add(proxy)
        self._read(proxy, None, sidecar.shape)

    def detach(self, proxy: ProxyKey) -> None:
        sidecar = self._sidecars.pop(proxy, None)
        if sidecar is None:
            return
        at = self._at_ip[sidecar.ip]
        at.discard(proxy)
        if not at:
            del self._at_ip[sidecar.ip]
        self._unread(proxy, sidecar.shape, None)

    def build(self, request: PushRequest) -> Changes:
        """Reconsider the proxies whose IP or namespace the request touches."""
        registry = request.registry
        if not self._sidecars:
            self._unfollowed |= registry.full | registry.endpoints
            return Changes()
        self._follow_all()
        addresses: set[str] = set()
        for key in sorted(registry.full | registry.endpoints):
            addresses |= self._track(key, full=key in registry.full)
        addresses |= registry.workloads
        affected = {p for a in addresses & self._at_ip.keys() for p in self._at_ip[a]}
        if request.mtls_namespaces:
            everyone = self._policies.root_namespace in request.mtls_namespaces
            affected |= {
                p
                for p, s in self._sidecars.items()
                if everyone or s.namespace in request.mtls_namespaces
            }
        changes = Changes()
        try:
            for proxy in sorted(affected, key=lambda p: (p.node_id, p.identity or "")):
                moved = self._reshape(proxy)
                if moved:
                    changes.owned[proxy] = moved
        finally:
            self._modes_seen.clear()  # the policies may change before the next build
            self._authz_seen.clear()
            self._jwt_seen.clear()
        return changes

    # -- shapes --------------------------------------------------------------------

    def _shape(self, ip: str, namespace: str, proxy: ProxyKey) -> InboundShape:
        """The shape of a sidecar at `ip` in `namespace`, from the registry as it is: the
        endpoint sets of its namespace at its address (another namespace's claim none)."""
        ports: dict[int, InboundProtocol] = {}
        by_service: dict[ServiceKey, list[tuple[EndpointPort, ...]]] = {}
        for set_key in self._sets_at.get(ip, ()):
            if set_key.namespace != namespace:
                continue
            endpoint_set, where = self._sets[set_key]
            by_service.setdefault(endpoint_set.service, []).append(where[ip])
        for key in sorted(by_service):
            service = self._index.services.get(key)
            if service is None:
                continue
            for service_port in service.ports:
                protocol = inbound_protocol(service_port)
                if protocol is None:
                    continue
                for endpoint_ports in by_service[key]:
                    target = _target(endpoint_ports, service_port.name)
                    # The sidecar's own ports get no chain, silently: a Service that
                    # selects pods on 15090 (metrics) or 15021 is common and honest.
                    if target is not None and not reserved(target):
                        ports.setdefault(target, protocol)  # first service by name wins
        workloads = self._index.pod_labels_in(namespace, ip)
        modes = self._modes(namespace, workloads)
        if modes.uncertain:
            self._fail_closed(ip, namespace, proxy)
        authz = self._applied(namespace, workloads)
        if authz.allow_uncertain:
            self._fail_closed(ip, namespace, proxy, "AuthorizationPolicies select workloads")
        jwt = self._verified(namespace, workloads)
        return InboundShape(tuple(sorted(ports.items())), modes.mode, modes.ports, authz, jwt)

    def _verified(self, namespace: str, workloads: list[dict[str, str]]) -> AppliedAuthentications:
        key = (namespace, tuple(tuple(sorted(labels.items())) for labels in workloads))
        applied = self._jwt_seen.get(key)
        if applied is None:
            applied = self._jwt_seen[key] = self._jwt.applied(namespace, workloads)
        return applied

    def _applied(self, namespace: str, workloads: list[dict[str, str]]) -> AppliedPolicies:
        key = (namespace, tuple(tuple(sorted(labels.items())) for labels in workloads))
        applied = self._authz_seen.get(key)
        if applied is None:
            applied = self._authz_seen[key] = self._authz.policies_for(namespace, workloads)
        return applied

    def _modes(self, namespace: str, workloads: list[dict[str, str]]) -> WorkloadModes:
        key = (namespace, tuple(tuple(sorted(labels.items())) for labels in workloads))
        modes = self._modes_seen.get(key)
        if modes is None:
            modes = self._modes_seen[key] = self._policies.modes_for(namespace, workloads)
        return modes

    def _fail_closed(self, ip: str, namespace: str, proxy: ProxyKey, why: str = "") -> None:
        """Counted each time such a shape is computed; said once per (IP, namespace, why)."""
        self.failed_closed += 1
        seen = (ip, namespace, why)
        if seen in self._warned or len(self._warned) >= MAX_FAILED_CLOSED_LOGGED:
            return
        self._warned.add(seen)
        if why:
            log.warning(
                "%s: its Pod in namespace %s is not known (or not one), and %s there:"
                " it allows only what the namespace- and mesh-wide ALLOW policies allow",
                proxy,
                clipped(namespace),
                why,
            )
            return
        log.warning(
            "%s: its Pod in namespace %s is not known (or not one), and workload"
            " PeerAuthentications exist there: it gets the strictest modes they could give",
            proxy,
            clipped(namespace),
        )

    def _reshape(self, proxy: ProxyKey) -> dict[str, set[str]]:
        sidecar = self._sidecars[proxy]
        shape = self._shape(sidecar.ip, sidecar.namespace, proxy)
        if shape == sidecar.shape:
            return {}
        self._sidecars[proxy] = _Sidecar(sidecar.ip, sidecar.namespace, shape)
        return self._read(proxy, sidecar.shape, shape)

    def _read(
        self, proxy: ProxyKey, old: InboundShape | None, new: InboundShape
    ) -> dict[str, set[str]]:
        """Make `proxy` read `new` instead of `old`; returns the names that moved per type."""
        moved: dict[str, set[str]] = {}
        listeners = self._listener_table(new)
        listeners.readers += 1
        if self._cache.set_overlay(proxy, types.LISTENER, listeners.flavor, _LISTENERS_WHEN):
            moved[types.LISTENER] = {VIRTUAL_INBOUND}
        if old is None or _clusters_of(old) != _clusters_of(new):
            clusters = self._cluster_table(_clusters_of(new))
            clusters.readers += 1
            self._cache.set_overlay(proxy, types.CLUSTER, clusters.flavor, _CLUSTERS_WHEN)
            names = set(self._cache.shared_table(types.CLUSTER, clusters.flavor))
            if old is not None:
                names |= self._cluster_names(_clusters_of(old))
            moved[types.CLUSTER] = names
        if old is not None:
            self._unread(proxy, old, new)
        return moved

    def _unread(self, proxy: ProxyKey, old: InboundShape, new: InboundShape | None) -> None:
        """`proxy` no longer reads `old` (it reads `new`, or nothing): drop unread tables."""
        table = self._listeners[old]
        table.readers -= 1
        if not table.readers:
            del self._listeners[old]
            self._cache.drop_flavor(types.LISTENER, table.flavor)
        if new is None:
            self._cache.set_overlay(proxy, types.LISTENER, None)
        if new is None or _clusters_of(new) != _clusters_of(old):
            clusters = self._clusters[_clusters_of(old)]
            clusters.readers -= 1
            if not clusters.readers:
                del self._clusters[_clusters_of(old)]
                self._cache.drop_flavor(types.CLUSTER, clusters.flavor)
                self._release_clusters(_clusters_of(old))
            if new is None:
                self._cache.set_overlay(proxy, types.CLUSTER, None)

    def _listener_table(self, shape: InboundShape) -> _Table:
        table = self._listeners.get(shape)
        if table is None:
            table = self._listeners[shape] = _Table(f"inbound-listeners#{next(self._ids)}")
            listener = virtual_inbound(shape, self._normalization)
            resource = Resource.from_message(types.LISTENER, VIRTUAL_INBOUND, listener)
            self._stats.serializations[types.LISTENER] += 1
            self._cache.update(types.LISTENER, [resource], flavor=table.flavor)
        return table

    def _cluster_table(self, key: ClusterKey) -> _Table:
        table = self._clusters.get(key)
        if table is None:
            table = self._clusters[key] = _Table(f"inbound-clusters#{next(self._ids)}")
            ports, uris = key
            resources = [
                self._cluster(None),
                *(self._cluster(p) for p in ports),
                *(self._cluster(u) for u in uris),
            ]
            self._cache.update(types.CLUSTER, resources, flavor=table.flavor)
        return table

    def _cluster(self, port: tuple[int, InboundProtocol] | JwksUri | None) -> Resource:
        """One inbound (or JWKS) cluster, serialized once for every table that holds it."""
        held = self._cluster_resources.get(port)
        if held is None:
            if port is None:
                message = inbound_passthrough_cluster()
            elif isinstance(port, JwksUri):
                message = jwks_cluster(port)
            else:
                message = inbound_cluster(*port)
            resource = Resource.from_message(types.CLUSTER, message.name, message)
            self._stats.serializations[types.CLUSTER] += 1
            held = self._cluster_resources[port] = _Held(resource)
        held.tables += 1
        return held.resource

    def _release_clusters(self, key: ClusterKey) -> None:
        """A cluster table went: forget the clusters no other table holds."""
        ports, uris = key
        for port in (None, *ports, *uris):
            held = self._cluster_resources[port]
            held.tables -= 1
            if not held.tables:
                del self._cluster_resources[port]

    @staticmethod
    def _cluster_names(key: ClusterKey) -> set[str]:
        ports, uris = key
        names = {INBOUND_PASSTHROUGH_CLUSTER, *(inbound_cluster_name(p) for p, _ in ports)}
        return names | {uri.cluster for uri in uris}

    # -- where addresses are ---------------------------------------------------------

    def _follow_all(self) -> None:
        """Catch up with what changed while nobody was attached (no one to push to)."""
        for key in sorted(self._unfollowed):
            self._track(key, full=False)
        self._unfollowed.clear()

    def _track(self, key: ServiceKey, full: bool) -> set[str]:
        """Follow a changed service's endpoint sets; returns the addresses whose ports may
        have changed (every one of the service's, when its own ports may have)."""
        now = (
            {s.key: s for s in self._index.endpoint_sets(key)}
            if key in self._index.services
            else {}
        )
        before = self._sets_of.pop(key, set())
        touched: set[str] = set()
        for set_key in before - now.keys():
            touched |= self._forget(set_key)
        for set_key, endpoint_set in now.items():
            held = self._sets.get(set_key)
            if held is not None and held[0] is endpoint_set:
                if full:
                    touched |= held[1].keys()
                continue
            touched |= self._remember(endpoint_set, held[1] if held is not None else {}, full)
        if now:
            self._sets_of[key] = set(now)
        return touched

    def _remember(self, endpoint_set: EndpointSet, old: AddressPorts, full: bool) -> set[str]:
        new = _addresses(endpoint_set)
        key = endpoint_set.key
        held = self._sets.get(key)
        self._sets[key] = (endpoint_set, new)
        came, went = new.keys() - old.keys(), old.keys() - new.keys()
        for address in went:
            self._unplace(address, key)
        for address in came:
            self._sets_at.setdefault(address, set()).add(key)
        if full:
            return old.keys() | new.keys()
        if held is not None and _one_port_list(held[0]) == _one_port_list(endpoint_set):
            return came | went  # the usual endpoint change: who is in it, not their ports
        return {a for a in old.keys() | new.keys() if old.get(a) != new.get(a)}

    def _forget(self, key: EndpointSetKey) -> set[str]:
        held = self._sets.pop(key, None)
        if held is None:
            return set()
        for address in held[1]:
            self._unplace(address, key)
        return set(held[1])

    def _unplace(self, address: str, key: EndpointSetKey) -> None:
        sets = self._sets_at.get(address)
        if sets is not None:
            sets.discard(key)
            if not sets:
                del self._sets_at[address]


def _addresses(endpoint_set: EndpointSet) -> AddressPorts:
    """Every address of an endpoint set (ready or not: a pod's inbound side does not
    flap with its readiness), with the ports of the groups listing it."""
    groups = endpoint_set.groups
    if len(groups) == 1:  # the usual slice: one port list for all (built at C speed)
        group = groups[0]
        return dict.fromkeys((a for e in group.endpoints for a in e.addresses), group.ports)
    found: AddressPorts = {}
    for group in groups:
        for endpoint in group.endpoints:
            for address in endpoint.addresses:
                found[address] = found.get(address, ()) + group.ports
    return found


def _one_port_list(endpoint_set: EndpointSet) -> tuple[EndpointPort, ...] | None:
    """The port list every endpoint of the set has, when it has one group (None: several)."""
    return endpoint_set.groups[0].ports if len(endpoint_set.groups) == 1 else None


def _target(ports: Iterable[EndpointPort], name: str) -> int | None:
    """The target port an endpoint group lists under a service port's name."""
    for port in ports:
        if port.name == name:
            return port.port
    return None
