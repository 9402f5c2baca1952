"""Readings of pilot's EndpointIndex that unit tests share."""

from __future__ import annotations

from pilot.registry.index import EndpointIndex
from pilot.registry.model import ServiceKey


def marked(index: EndpointIndex, ip: str, service: ServiceKey) -> bool:
    """Whether the index marks `service`'s endpoint at `ip` for mTLS (its pod's sidecar)."""
    return any(
        index.runs_sidecar(endpoint_set.key, endpoint, ip)
        for endpoint_set in index.endpoint_sets(service)
        for group in endpoint_set.groups
        for endpoint in group.endpoints
        if ip in endpoint.addresses
    )
