"""With no traffic config, pilot's cluster and route for a service are istiod's.

The same API server, Service and Pod, no DestinationRule or VirtualService: istiod
(tools/istiod/build: Go and the Go module proxy; skipped without Go) and pilot each
serve one sidecar of the namespace. The service's cluster balances and limits as
istiod's does (LB policy, circuit breakers, connect timeout), and its route in route
configuration 80 says what istiod's does (the whole action: Istio's default retry
policy, no timeout, the grpc-timeout header honoured) and sends the attempt count.
The panic threshold is left out: istiod turns it off because it sends unready
endpoints, which pilot leaves out (docs/sidecar.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2

from pilot.xds import types
from tests.cluster.control_plane import ControlPlane
from tests.cluster.istiod_server import clusters_of, resources_of, side_by_side
from tests.cluster.workloads import (
    SERVICE_PORT,
)

CLUSTER_FIELDS = ("lb_policy", "circuit_breakers", "connect_timeout", "type")


def _route_of(config: route_pb2.RouteConfiguration, host: str) -> dict[str, Any]:
    """What the service's virtual host and its one route say: its whole action (cluster,
    timeouts, retries) and the attempt count."""
    [virtual_host] = [h for h in config.virtual_hosts if host in h.domains]
    [route] = virtual_host.routes
    return {
        "action": str(route.route),
        "retry_policy": str(route.route.retry_policy),
        "include_request_attempt_count": virtual_host.include_request_attempt_count,
    }


async def test_with_no_rule_the_cluster_and_route_are_istiods(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    host = f"ratings.{namespace}.svc.cluster.local"
    cluster = f"outbound|{SERVICE_PORT}||{host}"
    route = str(SERVICE_PORT)
    async with side_by_side(deployed, namespace, tmp_path, "ratings") as both:
        servers = both.servers
        clusters = {
            k: (await clusters_of(t, both.node_id, {cluster}))[cluster] for k, t in servers.items()
        }
        routes = {
            k: (await resources_of(t, both.node_id, types.ROUTE, [route], {route}))[route]
            for k, t in servers.items()
        }
    ours, theirs = ({f: str(getattr(clusters[k], f)) for f in CLUSTER_FIELDS} for k in servers)
    assert ours == theirs
    assert clusters["pilot"].lb_policy == cluster_pb2.Cluster.LEAST_REQUEST
    assert "max_retries {\n    value: 4294967295" in ours["circuit_breakers"], ours
    ours_route, theirs_route = (_route_of(routes[k], host) for k in servers)
    assert ours_route == theirs_route
    assert "previous_hosts" in ours_route["retry_policy"]
