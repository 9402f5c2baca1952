"""Type URLs pilot serves, how each is subscribed to and stored, and the push order."""

from __future__ import annotations

from typing import Final

CLUSTER: Final = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT: Final = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER: Final = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE: Final = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
SECRET: Final = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

# Make-before-break: clusters before their endpoints, listeners before routes,
# secrets early so that a cluster or listener never waits on one.
PUSH_ORDER: Final[tuple[str, ...]] = (CLUSTER, SECRET, ENDPOINT, LISTENER, ROUTE)

# Types whose every response carries the full set; a missing name is a deletion.
WILDCARD_TYPES: Final = frozenset({CLUSTER, LISTENER})

# Types subscribed to by name only: a wildcard on them is refused (it would ask
# for every proxy's secrets; Envoy never sends one).
NAMED_ONLY_TYPES: Final = frozenset({SECRET})

# Types whose resources may belong to one proxy (workload secrets).
OWNED_TYPES: Final = frozenset({SECRET})

SHORT_NAMES: Final = {
    CLUSTER: "cds",
    ENDPOINT: "eds",
    LISTENER: "lds",
    ROUTE: "rds",
    SECRET: "sds",
}


def short_name(type_url: str) -> str:
    """A short label for a type URL (cds, eds, ...), for logs and metrics."""
    return SHORT_NAMES.get(type_url, "unknown")


def push_rank(type_url: str) -> int:
    """Position of a type in the push order; unknown types go last."""
    try:
        return PUSH_ORDER.index(type_url)
    except ValueError:
        return len(PUSH_ORDER)
