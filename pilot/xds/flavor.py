"""Cluster flavors: how a client fetched its clusters, which decides their EDS config source.

Over ADS a cluster's endpoints say `ads`; over the standalone CDS service they
name the bootstrap cluster with the same API type the client used (GRPC or
DELTA_GRPC). The same cluster is therefore built once per flavor, and each
stream reads the flavor of the RPC it came in on.
"""

from __future__ import annotations

from enum import StrEnum


class Flavor(StrEnum):
    """How a client fetched its clusters."""

    ADS = "ads"
    GRPC = "grpc"
    DELTA_GRPC = "delta_grpc"


# The clusters of ADS streams that read listeners: every ADS cluster, plus the ones
# their listeners name beside services (PassthroughCluster, BlackHoleCluster). The
# same resources, encoded once, in a table of their own.
ADS_WITH_LISTENERS = "ads+listeners"
