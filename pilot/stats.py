"""Counters the control plane keeps about its own work (read by tests, benchmarks, metrics)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class XdsStats:
    """What pilot did: serializations and responses per type, pushes, NACKs."""

    serializations: Counter[str] = field(default_factory=Counter)
    responses: Counter[str] = field(default_factory=Counter)
    pushes: int = 0
    streams_woken: int = 0
    inbound_updates: Counter[str] = field(default_factory=Counter)
    nacks: Counter[str] = field(default_factory=Counter)
    stale_nonces: Counter[str] = field(default_factory=Counter)
    # Service ports given no outbound listener: the sidecar keeps them for itself.
    reserved_ports: int = 0
    # Istio objects refused as invalid (DestinationRule, VirtualService), by kind.
    config_rejected: Counter[str] = field(default_factory=Counter)
    # AuthorizationPolicies (or parts of them) enforced stricter than written, because
    # pilot cannot translate them: each arrival of such a policy counts once.
    authz_failed_closed: int = 0
    # Route configuration flavors held for sidecars whose routes depend on who they are
    # (a gauge: the RDS generator keeps it, `reset` leaves it).
    route_flavors: int = 0
    cluster_flavors: int = 0  # cluster and assignment tables of namespaces with rules of their own
    # Sidecars that read the shared routes because PILOT_MAX_ROUTE_FLAVORS was reached.
    route_flavors_refused: int = 0

    def reset(self) -> None:
        self.serializations.clear()
        self.responses.clear()
        self.nacks.clear()
        self.stale_nonces.clear()
        self.inbound_updates.clear()
        self.pushes = 0
        self.streams_woken = 0
        self.reserved_ports = 0
