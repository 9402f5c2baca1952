"""What an Envoy holds, read back from its admin API, in a shape tests compare against."""

from __future__ import annotations

from typing import Any

from tests.support.envoy_process import XDS_CLUSTER, EnvoyProcess

# cluster name -> {(ip, port): "HEALTHY" | "DRAINING" | ...}
ClusterView = dict[str, dict[tuple[str, int], str]]


def _health(status: dict[str, Any]) -> str:
    return str(status.get("eds_health_status", "HEALTHY"))


async def dynamic_clusters(envoy: EnvoyProcess) -> ClusterView:
    """Every cluster pilot gave this Envoy, with its hosts and their EDS health."""
    view: ClusterView = {}
    for name in await envoy.cluster_names():
        if name != XDS_CLUSTER:
            hosts = await envoy.cluster_hosts(name)
            view[name] = {key: _health(health) for key, health in hosts.items()}
    return view


async def wait_for_view(envoy: EnvoyProcess, expected: ClusterView, what: str) -> None:
    """Wait until Envoy's clusters and hosts are exactly `expected`."""
    await envoy.wait_for(
        lambda: dynamic_clusters(envoy), 15.0, what, until=lambda view: view == expected
    )


async def assert_nothing_rejected_or_warming(envoy: EnvoyProcess) -> None:
    """No CDS or per-cluster update was rejected and no cluster is left warming."""
    stats = await envoy.stats()
    assert stats.get("cluster_manager.cds.update_rejected") == 0
    rejected = {
        name: value
        for name, value in stats.items()
        if name.startswith("cluster.") and name.endswith(".update_rejected") and value != 0
    }
    assert rejected == {}
    assert stats.get("cluster_manager.warming_clusters") == 0


async def host_priorities(envoy: EnvoyProcess, cluster: str) -> dict[str, int]:
    """address -> priority of each host of `cluster`, as Envoy holds it (/clusters)."""
    clusters: dict[str, Any] = await envoy.clusters()
    return {
        host["address"]["socket_address"]["address"]: host.get("priority", 0)
        for status in clusters.get("cluster_statuses", [])
        if status["name"] == cluster
        for host in status.get("host_statuses", [])
    }
