"""Sidecars' own inbound listeners, counted: a change to one pod's inbound side reaches
that pod only; an endpoint change anywhere else stays EDS only.

200 services, each with one endpoint; 40 sidecars on delta ADS (CDS `*`, LDS
`*`), sidecar i at the address of service i's endpoint, both in namespace
`ns-i` (a sidecar's inbound ports come from its own namespace's slices). Each
holds a `virtualInbound` for port 8080 and `inbound|8080||`. Then:
an endpoint of a service no sidecar is at changes (nothing but one
assignment is built, nothing is sent: they subscribe to no assignment); a
sidecar's IP joins another service on a new port (that sidecar alone gets
CDS then LDS, one listener and one cluster serialized); its namespace turns
STRICT (that sidecar alone gets LDS).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pilot.xds import types
from tests.support.envoy_process import wait_until
from tests.support.inbound_counting import next_change, sync_inbound
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import responses_written, running_pilot
from tests.support.xds_client import XdsClient, node

SERVICES = 200
SIDECARS = 40
TIMEOUT = 30.0
JOINER = 5  # the sidecar whose inbound side changes


def _ip(i: int, generation: int = 0) -> str:
    return f"127.{1 + generation}.{i // 250}.{1 + i % 250}"


def _sidecar(i: int) -> str:
    return f"sidecar~{_ip(i)}~pod-{i}.ns-{i}~ns-{i}.svc.cluster.local"


def _mesh(
    moved: int | None = None, joined: bool = False, strict: bool = False
) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for i in range(SERVICES):
        ip = _ip(i, 1 if i == moved else 0)
        objects += [
            service(f"svc-{i:03d}", f"ns-{i}"),
            endpoint_slice(f"svc-{i:03d}", [Ep(ip)], f"ns-{i}", name=f"svc-{i:03d}-1"),
        ]
    extra = [Ep(_ip(SERVICES + 1))] + ([Ep(_ip(JOINER))] if joined else [])
    objects += [
        service("admin", f"ns-{JOINER}", [("http", 9000)]),
        endpoint_slice("admin", extra, f"ns-{JOINER}", [("http", 9000)], name="admin-1"),
    ]
    if strict:
        objects.append(
            {
                "apiVersion": "security.istio.io/v1",
                "kind": "PeerAuthentication",
                "metadata": {"name": "default", "namespace": f"ns-{JOINER}"},
                "spec": {"mtls": {"mode": "STRICT"}},
            }
        )
    return objects


async def test_one_pods_inbound_change_reaches_that_pod_only(tmp_path: Path) -> None:
    async with running_pilot(tmp_path, _mesh()) as pilot, XdsClient(pilot.grpc_target) as client:
        streams = [client.delta_ads(node(_sidecar(i))) for i in range(SIDECARS)]
        await asyncio.gather(*(sync_inbound(s) for s in streams))
        stats = pilot.discovery.stats

        stats.reset()
        pilot.write(_mesh(moved=SERVICES - 1))
        await wait_until(lambda: stats.serializations[types.ENDPOINT] == 1, TIMEOUT, "a push")
        assert dict(stats.serializations) == {types.ENDPOINT: 1}, "nobody's inbound moved"
        assert dict(stats.responses) == {}, "no sidecar subscribes to that assignment"

        stats.reset()
        pilot.write(_mesh(moved=SERVICES - 1, joined=True))
        assert await next_change(streams[JOINER]) == (types.CLUSTER, {"inbound|9000||"}, set())
        assert await next_change(streams[JOINER]) == (types.LISTENER, {"virtualInbound"}, set())
        assert dict(stats.serializations) == {
            types.ENDPOINT: 1,  # admin's assignment
            types.LISTENER: 1,  # one new shape: 8080 and 9000
            types.CLUSTER: 1,  # inbound|9000||, once
        }
        await responses_written(stats, {types.CLUSTER: 1, types.LISTENER: 1})
        assert stats.streams_woken == 1

        stats.reset()
        pilot.write(_mesh(moved=SERVICES - 1, joined=True, strict=True))
        assert await next_change(streams[JOINER]) == (types.LISTENER, {"virtualInbound"}, set())
        assert dict(stats.serializations) == {types.LISTENER: 1}
        await responses_written(stats, {types.LISTENER: 1})
        assert stats.streams_woken == 1
