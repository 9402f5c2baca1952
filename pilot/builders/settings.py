"""What resource content depends on besides the registry: the names pilot was given,
and how sidecars normalize request paths."""

from __future__ import annotations

from dataclasses import dataclass

from pilot.builders.path_normalization import PathNormalization


@dataclass(frozen=True, slots=True)
class BuildSettings:
    """What resource content depends on besides the registry."""

    cluster_domain: str = "cluster.local"
    xds_cluster_name: str = "xds-grpc"
    trust_domain: str = "cluster.local"  # of the SPIFFE identities sidecars' clusters accept
    # PILOT_PATH_NORMALIZATION: every HTTP connection manager's, inbound and outbound.
    path_normalization: PathNormalization = PathNormalization.BASE
