"""Istio's cluster naming: `outbound|PORT|SUBSET|HOST`."""

from __future__ import annotations

from pilot.registry.model import ServiceKey, ServicePort


def outbound_cluster_name(service: ServiceKey, port: ServicePort, cluster_domain: str) -> str:
    """The cluster (and ClusterLoadAssignment) name for one Service port."""
    return f"outbound|{port.port}||{service.hostname(cluster_domain)}"


def subset_cluster_name(
    service: ServiceKey, port: ServicePort, subset: str, cluster_domain: str
) -> str:
    """A DestinationRule subset's cluster: `outbound|PORT|SUBSET|HOST`."""
    return f"outbound|{port.port}|{subset}|{service.hostname(cluster_domain)}"
