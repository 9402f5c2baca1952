"""Routes meant for one namespace, or one Pod, against a proxy that claims to be there.

pilot is a real `pilot discovery --config FILE --xds-auth kubernetes` subprocess (the
tokens proven by `--token-auth-file`). In namespace ns-b a VirtualService exported to
ns-b alone sends the Pod labelled `app: victim` (its sidecar at 10.0.0.2, account
victim) to v3 and the rest of ns-b to v2. The victim, over TLS with its token, gets
both routes. An attacker with its own token (ns-a) whose node id claims ns-b and the
victim's IP gets the shared default route: what it proved picks its routes, never its
node id, and a Pod of ns-b is no Pod of ns-a's. (A stream that proves nothing reads the
shared routes too: tests/integration/test_client_routes_hostile.py; here every port
asks for a token.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envoy.config.route.v3 import route_pb2

from pilot.xds import types
from tests.support.ca import write_plugged_in
from tests.support.mesh import Ep, endpoint_slice, pod, service, write_mesh
from tests.support.pilot_process import launch
from tests.support.xds_client import DeltaStream, delta_resources, node

HOST = "reviews.ns-b.svc.cluster.local"
VICTIM_ID = "sidecar~10.0.0.2~victim-1.ns-b~ns-b.svc.cluster.local"
WAIT = 20.0
TOKENS = {"victim-token-0123456789": "ns-b:victim", "attacker-token-0123456789": "ns-a:attacker"}


def objects() -> list[dict[str, Any]]:
    def to(subset: str) -> dict[str, Any]:
        return {"destination": {"host": "reviews", "subset": subset}}

    spec = {
        "hosts": ["reviews"],
        "exportTo": ["."],
        "http": [
            {"match": [{"sourceLabels": {"app": "victim"}}], "route": [to("v3")]},
            {"route": [to("v2")]},
        ],
    }
    return [
        service("reviews", "ns-b", [("http", 9080)]),
        endpoint_slice("reviews", [Ep("10.1.0.1")], "ns-b", [("http", 9080)]),
        pod("victim-1", "10.0.0.2", "ns-b", service_account="victim", labels={"app": "victim"}),
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": "ns-b"},
            "spec": spec,
        },
    ]


async def subsets(stream: DeltaStream) -> list[str]:
    """The subset each route of reviews goes to in route configuration 9080 ("": none)."""
    await stream.subscribe(types.ROUTE, ["9080"])
    while True:
        response = await stream.next_response(WAIT)
        await stream.ack(response)
        got = delta_resources(response).get("9080")
        if got is not None:
            config: route_pb2.RouteConfiguration = got.message
            [vhost] = [h for h in config.virtual_hosts if h.name == f"{HOST}:9080"]
            return [r.route.cluster.split("|")[2] for r in vhost.routes]


async def test_a_claimed_namespace_or_address_reads_none_of_its_routes(tmp_path: Path) -> None:
    ca = write_plugged_in(tmp_path / "plugged-in-ca")
    mesh = tmp_path / "mesh.yaml"
    write_mesh(mesh, objects())
    tokens = tmp_path / "tokens.csv"
    lines = [f"{t},system:serviceaccount:{account}\n" for t, account in TOKENS.items()]
    tokens.write_text("".join(lines))
    tokens.chmod(0o600)
    source = ["--config", str(mesh), "--xds-auth", "kubernetes", "--token-auth-file", str(tokens)]
    pilot = await launch(tmp_path, source, ca.directory, ca.root.cert_pem.encode())
    try:
        victim_meta = {"NAMESPACE": "ns-b", "SERVICE_ACCOUNT": "victim"}
        async with pilot.client(tls=True, token="victim-token-0123456789") as victim:
            assert await subsets(victim.delta_ads(node(VICTIM_ID, victim_meta))) == ["v3", "v2"]
        async with pilot.client(tls=True, token="attacker-token-0123456789") as attacker:
            assert await subsets(attacker.delta_ads(node(VICTIM_ID))) == [""]
    finally:
        await pilot.stop()
