"""Routes and clusters meant for one namespace, or one Pod, against a proxy that claims to
be there.

pilot is a real `pilot discovery --config FILE --xds-auth kubernetes` subprocess (the
tokens proven by `--token-auth-file`). In namespace ns-b a VirtualService exported to
ns-b alone sends the Pod labelled `app: victim` (its sidecar at 10.0.0.2, account
victim) to v3 and the rest of ns-b to v2, and a DestinationRule exported to ns-b alone
defines those subsets with a connection limit. The victim, over TLS with its token, gets
both routes and the rule's clusters. An attacker with its own token (ns-a) whose node
id claims ns-b and the victim's IP (its metadata may not: refused outright) gets the
shared default route and the shared clusters: what it proved picks its routes and
clusters, never its node, and a Pod of ns-b is no Pod of ns-a's. (A stream that
proves nothing reads the shared routes too:
tests/integration/test_client_routes_hostile.py; here every port asks for a token.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from envoy.config.route.v3 import route_pb2

from pilot.xds import types
from tests.support.ca import write_plugged_in
from tests.support.mesh import Ep, endpoint_slice, pod, service, write_mesh
from tests.support.pilot_process import PilotProcess, launch
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
    rule = {
        "host": "reviews",
        "exportTo": ["."],
        "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 3}}},
        "subsets": [{"name": v, "labels": {"version": v}} for v in ("v2", "v3")],
    }
    return [
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "reviews", "namespace": "ns-b"},
            "spec": rule,
        },
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


async def clusters(stream: DeltaStream) -> dict[str, int]:
    """Each cluster of reviews, and its connection limit (0: no thresholds)."""
    await stream.subscribe(types.CLUSTER, ["*"])
    response = await stream.next_response(WAIT)
    await stream.ack(response)
    found = {}
    for name, got in delta_resources(response).items():
        if name.endswith(f"|{HOST}"):
            thresholds = got.message.circuit_breakers.thresholds
            found[name] = thresholds[0].max_connections.value if thresholds else 0
    return found


@asynccontextmanager
async def token_pilot(tmp_path: Path) -> AsyncIterator[PilotProcess]:
    """pilot on the mesh above, each token of TOKENS proving its account."""
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
        yield pilot
    finally:
        await pilot.stop()


async def test_a_claimed_namespace_or_address_reads_none_of_its_routes(tmp_path: Path) -> None:
    async with token_pilot(tmp_path) as pilot:
        victim_meta = {"NAMESPACE": "ns-b", "SERVICE_ACCOUNT": "victim"}
        async with pilot.client(tls=True, token="victim-token-0123456789") as victim:
            assert await subsets(victim.delta_ads(node(VICTIM_ID, victim_meta))) == ["v3", "v2"]
        async with pilot.client(tls=True, token="attacker-token-0123456789") as attacker:
            assert await subsets(attacker.delta_ads(node(VICTIM_ID))) == [""]


async def test_a_claimed_namespace_reads_none_of_its_clusters(tmp_path: Path) -> None:
    sidecar = {"NAMESPACE": "ns-b", "SERVICE_ACCOUNT": "victim", "INTERCEPTION_MODE": "REDIRECT"}
    base = f"outbound|9080||{HOST}"
    async with token_pilot(tmp_path) as pilot:
        async with pilot.client(tls=True, token="victim-token-0123456789") as victim:
            got = await clusters(victim.delta_ads(node(VICTIM_ID, sidecar)))
            assert got == {base: 3, f"outbound|9080|v2|{HOST}": 3, f"outbound|9080|v3|{HOST}": 3}
        async with pilot.client(tls=True, token="attacker-token-0123456789") as attacker:
            # Its metadata may not name ns-b (refused outright): its node id claims it.
            claims = node(VICTIM_ID, {"INTERCEPTION_MODE": "REDIRECT"})
            got = await clusters(attacker.delta_ads(claims))
            assert got.keys() == {base}  # no subset of ns-b's rule
            assert got[base] != 3  # nor its limit
