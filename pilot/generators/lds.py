"""LDS: a sidecar's outbound listeners, one flavor per interception mode, rebuilt per address.

Listeners depend on services and their ports (and, for a TCP port, its service's
VirtualService's tcp routes: `PushRequest.routes`), never on endpoints: an
endpoint change builds nothing here. Each service claims listener addresses
(`ListenerKey`: address and port, per mode); a full change of a service
rebuilds only the addresses it claimed before or claims now, each listener
serialized once per mode, and shared by every proxy of that mode.
`virtualOutbound` (REDIRECT mode only) depends on the traffic policy alone; its
first chain sends a connection to 15001 itself to `BlackHoleCluster` (Istio's
`virtualOutbound-blackhole`), so nothing loops through it.

A service port on one of the sidecar's own ports (`pilot.builders.proxy_ports`)
claims no address in any mode (`outbound_ports` leaves it out): the operator
hears it once per service (a warning naming it and the ports, at most
MAX_CONFLICTS_LOGGED services at a time) and `pilot_reserved_ports` counts it.
A TCP port's listener is its ClusterIP's; a ClusterIP of 0.0.0.0 or :: gets
none, as a headless Service's (it would be the wildcard: every destination).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from pilot.builders.listeners import (
    Claims,
    ListenerKey,
    claimed_addresses,
    outbound_listener,
    virtual_outbound,
    winner,
)
from pilot.builders.naming import outbound_cluster_name
from pilot.builders.outbound import (
    VIRTUAL_OUTBOUND,
    OutboundSettings,
    listener_name,
    outbound_ports,
    reserved_ports,
)
from pilot.builders.proxy_ports import RESERVED_PORTS
from pilot.builders.settings import BuildSettings
from pilot.generators.claims import ServiceClaims
from pilot.generators.mesh_routes import MeshRoutes
from pilot.logs import clipped
from pilot.push.request import Changes, PushRequest
from pilot.registry.index import EndpointIndex
from pilot.registry.model import Service, ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.interception import Interception
from pilot.xds.resource import Resource

log = logging.getLogger("pilot.xds")
MAX_CONFLICTS_LOGGED = 16


class ListenerGenerator:
    """The LDS generator: services' ports in, listeners per interception mode out."""

    type_urls = frozenset({types.LISTENER})

    def __init__(
        self,
        index: EndpointIndex,
        cache: ResourceCache,
        settings: OutboundSettings,
        build: BuildSettings,
        stats: XdsStats,
        *,
        traffic: TrafficConfig | None = None,
    ) -> None:
        self._index = index
        traffic = traffic if traffic is not None else TrafficConfig(build.cluster_domain)
        self._mesh = MeshRoutes(traffic, index, build.cluster_domain)
        self._cache = cache
        self._settings = settings
        self._domain = build.cluster_domain
        self._normalization = build.path_normalization
        self._stats = stats
        self._claims: ServiceClaims[ListenerKey, tuple[str, bool]] = ServiceClaims()
        self._conflicts: set[ListenerKey] = set()  # logged once each
        # Services with ports the sidecar keeps for itself: those ports, refused now.
        self._reserved: dict[ServiceKey, tuple[int, ...]] = {}
        self._reserved_logged: set[ServiceKey] = set()
        self._started = False

    def build(self, request: PushRequest) -> Changes:
        """Rebuild the listeners of the addresses the changed services claim(ed)."""
        changed: set[str] = set()
        if not self._started:
            self._started = True
            resource = Resource.from_message(
                types.LISTENER, VIRTUAL_OUTBOUND, virtual_outbound(self._settings)
            )
            self._store(Interception.REDIRECT, [resource], [])
            changed.add(VIRTUAL_OUTBOUND)
        affected: set[ListenerKey] = set()
        changed_services = request.registry.full | request.routes
        if changed_services:
            self._mesh.refresh()
        for key in sorted(changed_services):
            affected |= self._reclaim(key)
        changed |= self._rebuild(affected)
        return Changes(shared={types.LISTENER: changed}) if changed else Changes()

    def _reclaim(self, key: ServiceKey) -> set[ListenerKey]:
        """Move a service's claims to what it has now; returns every address touched."""
        service = self._index.services.get(key)
        self._note_reserved(key, reserved_ports(service) if service is not None else ())
        return self._claims.reclaim(key, self._claims_of(key, service))

    def _claims_of(
        self, key: ServiceKey, service: Service | None
    ) -> Iterator[tuple[ListenerKey, tuple[str, bool]]]:
        """The addresses the service's ports claim in each mode, with cluster and protocol."""
        cluster_ip = service.cluster_ip if service is not None else ""
        for port, http in outbound_ports(service) if service is not None else []:
            cluster = outbound_cluster_name(key, port, self._domain)
            for mode in Interception:
                address = claimed_addresses(mode, cluster_ip, port.port, http)
                if address is not None:
                    yield (mode, *address), (cluster, http)

    def _rebuild(self, affected: set[ListenerKey]) -> set[str]:
        changed: set[str] = set()
        for mode in Interception:
            built, gone = [], []
            for listener in sorted(k for k in affected if k[0] is mode):
                _, address, port = listener
                claims = self._claims.of(listener)
                if not claims:
                    self._conflicts.discard(listener)
                    gone.append(listener_name(address, port))
                    continue
                key, cluster, http = winner(claims)
                self._note_conflict(listener, claims)
                weighted = () if http else self._tcp_route(key, port)
                message = outbound_listener(
                    mode,
                    address,
                    port,
                    cluster,
                    http,
                    weighted=weighted,
                    normalization=self._normalization,
                )
                built.append(Resource.from_message(types.LISTENER, message.name, message))
            changed |= self._store(mode, built, gone)
        return changed

    def _tcp_route(self, key: ServiceKey, port: int) -> tuple[tuple[str, int], ...]:
        """A VirtualService's tcp route for the service's TCP port (() for none)."""
        service = self._index.services.get(key)
        cluster_ip = service.cluster_ip if service is not None else ""
        return self._mesh.tcp_route(key.hostname(self._domain), cluster_ip, port)

    def _store(self, mode: Interception, built: list[Resource], gone: list[str]) -> set[str]:
        if built:
            self._stats.serializations[types.LISTENER] += len(built)
        return self._cache.update(types.LISTENER, built, gone, flavor=mode.value)

    def _note_reserved(self, key: ServiceKey, ports: tuple[int, ...]) -> None:
        """A service on the sidecar's own ports gets no listener there: counted, said once."""
        before = self._reserved.pop(key, ())
        if not ports:
            self._reserved_logged.discard(key)
            return
        self._reserved[key] = ports
        refused = len(set(ports) - set(before))
        if not refused:
            return
        self._stats.reserved_ports += refused
        if len(self._reserved_logged) >= MAX_CONFLICTS_LOGGED:
            return
        self._reserved_logged.add(key)
        log.warning(
            "service %s: port(s) %s are the sidecar's own (Envoy's and the agent's %s);"
            " no outbound listener or route for them",
            clipped(str(key)),
            ", ".join(map(str, ports)),
            ", ".join(map(str, sorted(RESERVED_PORTS))),
        )

    def _note_conflict(self, listener: ListenerKey, claims: Claims) -> None:
        """A TCP service shares its listener address: one wins, the operator hears it once.

        (HTTP services sharing a port is no conflict: their routes tell them apart.)
        """
        tcp = sum(1 for _, http in claims.values() if not http)
        if len(claims) < 2 or not tcp or listener in self._conflicts:
            return
        if len(self._conflicts) >= MAX_CONFLICTS_LOGGED:
            return
        self._conflicts.add(listener)
        mode, address, port = listener
        key, _, http = winner(claims)
        log.warning(
            "%d services share the outbound listener %s (%s mode): %s (%s) gets it,"
            " the others are reached by routes only or not at all",
            len(claims),
            listener_name(address, port),
            mode.value,
            key,
            "HTTP" if http else "TCP",
        )
