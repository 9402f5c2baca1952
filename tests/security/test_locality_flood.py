"""A locality is whatever a proxy declares: made-up ones must not multiply the work.

Each proxy locality in use costs a variant of every assignment, rebuilt on every
endpoint change. With PILOT_MAX_LOCALITIES at 2, two honest proxies in two zones
get their endpoints in priorities (web's DestinationRule sets outlier detection,
which turns Istio's locality failover on); thirty streams each declaring a made-up
locality, and then an honest third zone, get the endpoints without priorities
(those of proxies without a locality), are logged (a bounded number of lines), and
one endpoint change still builds
three assignments (the shared one and the two localities'), not thirty-four.
When a locality's last proxy leaves, its slot is free for the next one.

pilot runs with `--xds-auth none`, and every proxy here names its account in its
node metadata: the identity that mode trusts, so they all draw on the budget of
proven proxies (PILOT_MAX_LOCALITIES). Streams that prove nothing have a budget of
their own: tests/security/test_locality_budget.py.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.push.pipeline import MAX_REFUSALS_LOGGED
from pilot.push.settings import PushSettings
from pilot.xds import types
from tests.support.envoy_process import wait_until
from tests.support.mesh import Ep, cluster_name, endpoint_slice, service
from tests.support.pilot import running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, node

WEB = cluster_name("web")
TIMEOUT = 20.0
LIARS = 30
A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"  # in zone-a, zone-b, zone-c


# Outlier detection turns locality failover on (Istio's rule): each locality's own
# priorities, so each variant differs.
FAILOVER = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "DestinationRule",
    "metadata": {"name": "web", "namespace": "default"},
    "spec": {"host": "web", "trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 5}}},
}


def _mesh(generation: int) -> list[dict[str, Any]]:
    """web's endpoints in three zones, plus one in zone-b that each generation moves."""
    moved = Ep(_moved(generation), zone="zone-b")
    zoned = [Ep(A, zone="zone-a"), Ep(B, zone="zone-b"), Ep(C, zone="zone-c"), moved]
    return [service("web"), endpoint_slice("web", zoned, name="web-1"), FAILOVER]


def _moved(generation: int) -> str:
    return f"10.0.1.{generation}"


def _node(n: int, region: str, zone: str = "") -> base_pb2.Node:
    metadata = {"NAMESPACE": "default", "SERVICE_ACCOUNT": f"p{n}"}  # trusted as given
    located = node(f"sidecar~10.9.0.{n}~p{n}.default~default.svc.cluster.local", metadata)
    located.locality.region, located.locality.zone = region, zone
    return located


def _in_zone(n: int, zone: str) -> base_pb2.Node:
    return _node(n, "Kubernetes", zone)  # the file has no Nodes: region is the cluster id


async def _subscribed(client: XdsClient, located: base_pb2.Node) -> DeltaStream:
    stream = client.delta_ads(located)
    await stream.subscribe(types.ENDPOINT, [WEB])
    await stream.ack(await stream.next_response(TIMEOUT))
    return stream


async def _priorities(stream: DeltaStream) -> dict[str, int]:
    """address -> priority in the next assignment the stream gets."""
    response = await stream.next_response(TIMEOUT)
    await stream.ack(response)
    assignment = endpoint_pb2.ClusterLoadAssignment.FromString(response.resources[0].resource.value)
    return {
        lb.endpoint.address.socket_address.address: group.priority
        for group in assignment.endpoints
        for lb in group.lb_endpoints
    }


def _near(zone_of: dict[str, str], zone: str, generation: int) -> dict[str, int]:
    """What a proxy in `zone` (of the cluster's region) gets: its zone 0, the rest 1."""
    return {ip: 0 if where == zone else 1 for ip, where in zone_of.items()} | {
        _moved(generation): 0 if zone == "zone-b" else 1
    }


ZONES = {A: "zone-a", B: "zone-b", C: "zone-c"}


def _flat(generation: int) -> dict[str, int]:
    return dict.fromkeys([A, B, C, _moved(generation)], 0)


async def test_made_up_localities_get_no_variants_of_their_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        running_pilot(tmp_path, _mesh(0), push=PushSettings(max_localities=2)) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        near_a = await _subscribed(client, _in_zone(1, "zone-a"))
        near_b = await _subscribed(client, _in_zone(2, "zone-b"))
        with caplog.at_level(logging.WARNING, logger="pilot.push"):
            liars = await asyncio.gather(
                *(_subscribed(client, _node(10 + i, f"made-up-{i}")) for i in range(LIARS))
            )
            third = await _subscribed(client, _in_zone(3, "zone-c"))
        refusals = [r for r in caplog.records if "PILOT_MAX_LOCALITIES" in r.getMessage()]
        assert len(refusals) == MAX_REFUSALS_LOGGED, "bounded, one line per locality"

        stats = pilot.discovery.stats
        stats.reset()
        pilot.write(_mesh(1))
        assert await _priorities(near_a) == _near(ZONES, "zone-a", 1)
        assert await _priorities(near_b) == _near(ZONES, "zone-b", 1)
        assert await _priorities(third) == _flat(1), "over the cap: no priorities"
        for liar in liars:
            assert await _priorities(liar) == _flat(1)
        assert dict(stats.serializations) == {types.ENDPOINT: 3}, "shared + two localities"

        # zone-a's only proxy leaves: its slot is free for the next locality.
        await near_a.close()
        streams = pilot.discovery.connections
        await wait_until(
            lambda: len(streams), 10, "zone-a's stream gone", until=lambda n: n == 32 + 1
        )
        later = await _subscribed(client, _in_zone(4, "zone-c"))
        pilot.write(_mesh(2))
        assert await _priorities(later) == _near(ZONES, "zone-c", 2)
