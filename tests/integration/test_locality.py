"""pilot reads Nodes as metadata only: it keeps two labels of them.

On the test API server, which shows the requests pilot sent (a real one cannot): every
list and watch of Nodes asks for `PartialObjectMetadata`, so a Node's status, images
and conditions never cross the wire to pilot. (Priorities by proximity from Nodes'
topology labels, with a real Envoy on the real API server:
tests/cluster/test_node_locality.py.)
"""

from __future__ import annotations

from pathlib import Path

from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, endpoint_slice, node, service
from tests.support.pilot import running_kube_pilot


async def test_nodes_are_read_as_metadata_only(tmp_path: Path) -> None:
    async with KubeAPIServer() as api:
        api.apply(node("n-eu-a", "eu", "a"))
        api.apply(service("shop"))
        api.apply(endpoint_slice("shop", [Ep("127.0.7.1", node="n-eu-a")]))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        async with running_kube_pilot(kubeconfig):
            await wait_until(
                lambda: api.requests_for("Node", watch=True), 10.0, "pilot watching Nodes"
            )
        node_reads = api.requests_for("Node")
        assert api.requests_for("Node", watch=False), "pilot lists Nodes"
        assert all("as=PartialObjectMetadata" in r.accept for r in node_reads), (
            "Nodes are read as metadata only: pilot keeps two labels of them"
        )
