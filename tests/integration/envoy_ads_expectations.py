"""What a real Envoy on pilot should hold for a registry of `simple_mesh` services:
`expected(mesh)` is each service's cluster with its endpoints on the target port
(8080), all HEALTHY, in the cluster domain given.
"""

from __future__ import annotations

from tests.support.envoy_view import ClusterView
from tests.support.mesh import cluster_name

PORT = 8080


def expected(mesh: dict[str, list[str]], domain: str = "cluster.local") -> ClusterView:
    return {
        cluster_name(svc, domain=domain): {(ip, PORT): "HEALTHY" for ip in ips}
        for svc, ips in mesh.items()
    }
