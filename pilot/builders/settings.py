"""What resource content depends on besides the registry: the names pilot was given."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BuildSettings:
    """What resource content depends on besides the registry."""

    cluster_domain: str = "cluster.local"
    xds_cluster_name: str = "xds-grpc"
    trust_domain: str = "cluster.local"  # of the SPIFFE identities sidecars' clusters accept
