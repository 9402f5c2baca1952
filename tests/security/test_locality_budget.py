"""Locality slot exhaustion from the plaintext port, against pilot in Kubernetes mode.

The plaintext port asks no credentials, and a locality is whatever a node declares.
100 streams there, each declaring a zone of its own, filled PILOT_MAX_LOCALITIES
(100), and an authenticated proxy (token, TLS port) then got its endpoints without
priorities; each made-up locality also cost a copy of every assignment (+247 MB).
Streams that proved no identity now share PILOT_MAX_UNVERIFIED_LOCALITIES (10) and
never take a proven proxy's slot: the authenticated proxy still gets a variant of its
own, the first ten made-up zones theirs, the ninety others none
(`pilot_locality_refused_total` counts them by budget).

Since pilot follows Istio's default (no locality failover without a DestinationRule's
outlier detection; this API server serves no DestinationRule), every variant holds the
same assignment, all in priority 0, and one endpoint change encodes it once, whatever
the number of variants. (Variants that differ, with a rule asking for failover, under
the same flood: tests/security/test_locality_flood.py.)

pilot is a real `pilot discovery` subprocess on the test API server, as deployed
(`--xds-auth kubernetes`, secrets on the TLS port only).
"""

from __future__ import annotations

from pathlib import Path

from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2

from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, cluster_name, endpoint_slice, service
from tests.support.peers import VICTIM, Mesh, running_mesh, victim_node_id
from tests.support.pilot_process import PilotProcess
from tests.support.xds_client import ENDPOINT, DeltaResponse, DeltaStream, XdsClient, node

WEB = cluster_name("web")
CLUSTER_ID = "Kubernetes"  # the local cluster's id: the region of endpoints without Nodes
FLOOD = 100  # unauthenticated streams, each in a made-up zone of its own
UNVERIFIED_SLOTS = 10  # PILOT_MAX_UNVERIFIED_LOCALITIES' default
VICTIM_ZONE = "zone-victim"
WAIT = 20.0


def _address(n: int) -> str:
    return f"10.2.{n // 200}.{n % 200 + 1}"


def _web(generation: int) -> list[dict[str, object]]:
    """web: one endpoint in each made-up zone, one in the victim's, and one that moves."""
    endpoints = [Ep(_address(n), zone=f"zone-{n}") for n in range(FLOOD)]
    endpoints += [Ep("10.3.0.1", zone=VICTIM_ZONE), Ep(f"10.4.0.{generation + 1}", zone="other")]
    return [service("web"), endpoint_slice("web", endpoints, name="web-1")]


def _located(node_id: str, zone: str, metadata: dict[str, str] | None = None) -> base_pb2.Node:
    located = node(node_id, metadata)
    located.locality.region, located.locality.zone = CLUSTER_ID, zone
    return located


def _priorities(response: DeltaResponse) -> dict[str, int]:
    """address -> priority in the response's assignment of web."""
    (resource,) = [r for r in response.resources if r.name == WEB]
    assignment = endpoint_pb2.ClusterLoadAssignment.FromString(resource.resource.value)
    return {
        lb.endpoint.address.socket_address.address: group.priority
        for group in assignment.endpoints
        for lb in group.lb_endpoints
    }


def _flat() -> dict[str, int]:
    return dict.fromkeys(_everyone(), 0)


def _everyone(generation: int = 0) -> list[str]:
    return [_address(n) for n in range(FLOOD)] + ["10.3.0.1", f"10.4.0.{generation + 1}"]


async def _assignment(stream: DeltaStream) -> dict[str, int]:
    await stream.subscribe(ENDPOINT, [WEB])
    response = await stream.next_response(WAIT)
    await stream.ack(response)
    return _priorities(response)


async def _metric(pilot: PilotProcess, sample: str) -> float:
    _, metrics = await pilot.get("/metrics")
    for line in metrics.splitlines():
        if line.startswith(sample):
            return float(line.rpartition(" ")[2])
    return 0.0


async def _eds_serializations(pilot: PilotProcess) -> float:
    return await _metric(pilot, 'pilot_xds_serializations_total{type="eds"}')


async def _refused(pilot: PilotProcess, budget: str) -> float:
    return await _metric(pilot, f'pilot_locality_refused_total{{budget="{budget}"}}')


async def _web_served(mesh: Mesh) -> None:
    async with XdsClient(mesh.pilot.target(tls=False)) as client:

        async def endpoints() -> int:
            response = await client.fetch_endpoints([WEB])
            return len(response.resources)

        await wait_until(endpoints, WAIT, "web's endpoints served", until=lambda n: n == 1)


async def test_unauthenticated_localities_cannot_take_a_proxys_variant(tmp_path: Path) -> None:
    async with running_mesh(tmp_path) as mesh:
        for obj in _web(0):
            mesh.srv.apply(obj)
        await _web_served(mesh)
        async with (
            XdsClient(mesh.pilot.target(tls=False)) as anonymous,
            mesh.pilot.client(tls=True, token=mesh.tokens[VICTIM]) as authenticated,
        ):
            flood = [anonymous.delta_ads(_located(f"liar-{n}", f"zone-{n}")) for n in range(FLOOD)]
            got = [await _assignment(stream) for stream in flood]  # one after another
            victim = authenticated.delta_ads(
                _located(victim_node_id("locality"), VICTIM_ZONE, VICTIM.metadata)
            )
            assert await _assignment(victim) == _flat(), "Istio's default: no priorities"
            assert all(priorities == _flat() for priorities in got)
            assert await _refused(mesh.pilot, "unverified") == FLOOD - UNVERIFIED_SLOTS
            assert await _refused(mesh.pilot, "proven") == 0, "the proxy had its slot"

            # One endpoint change: one assignment encoded, whatever the variants.
            before = await _eds_serializations(mesh.pilot)
            for obj in _web(1):
                mesh.srv.apply(obj)
            response = await victim.next_response(WAIT)
            assert _priorities(response) == dict.fromkeys(_everyone(1), 0)
            built = await _eds_serializations(mesh.pilot) - before
            assert built == 1, f"{built} encodings of web"
