"""The ports a sidecar keeps for itself: no Service port or target port may take them.

Istio's sidecar (and pilot's, `pilot.agent.bootstrap`, `pilot.agent.iptables`)
listens on these in the pod's network namespace:

- 15000: Envoy's admin API (127.0.0.1);
- 15001: `virtualOutbound`, where the capture rules send the app's connections;
- 15006: `virtualInbound`, where they send connections to the pod;
- 15020: the agent's status port (Istio's; excluded from capture like the next two);
- 15021: Envoy's readiness listener (`/healthz/ready`);
- 15090: Envoy's Prometheus listener (`/stats/prometheus`).

A listener pilot builds on one of them either collides with Envoy's own (Envoy
rejects the whole LDS update: "duplicate address") or binds beside it, and a
chain that forwards to one by original destination can come back captured and
loop. So outbound listeners and inbound chains skip them, and the listeners that
forward by original destination (15001, 15006) send a connection to themselves
to `BlackHoleCluster`.
"""

from __future__ import annotations

ADMIN_PORT = 15000
VIRTUAL_OUTBOUND_PORT = 15001
VIRTUAL_INBOUND_PORT = 15006
AGENT_STATUS_PORT = 15020
READINESS_PORT = 15021
PROMETHEUS_PORT = 15090
RESERVED_PORTS = frozenset(
    {
        ADMIN_PORT,
        VIRTUAL_OUTBOUND_PORT,
        VIRTUAL_INBOUND_PORT,
        AGENT_STATUS_PORT,
        READINESS_PORT,
        PROMETHEUS_PORT,
    }
)


def reserved(port: int) -> bool:
    """Whether `port` is one the sidecar keeps for itself."""
    return port in RESERVED_PORTS
