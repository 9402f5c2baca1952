"""The fast path, counted: one endpoint change, one serialization, only its subscribers.

A mesh of 500 services; 200 delta ADS streams, stream i subscribed to every
cluster (CDS `*`) and to the assignment of service i. Changing one endpoint
must serialize exactly one ClusterLoadAssignment, send no CDS at all, and wake
only the streams subscribed to that cluster. With a Kubernetes source, a
burst of 1,000 endpoint events inside one debounce window is one push per
affected stream. With every service in a second cluster too, a change in that
cluster costs the same: one assignment, with the endpoints of both. With proxies
in several localities, one change builds one assignment per locality in use where
the service's DestinationRule asks for locality failover, never one per proxy, and
one for all of them where nothing does (Istio's default). (What a Pod's label,
status and service account cost, on the real API server:
tests/cluster/test_pod_tls_mode.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2

from pilot.push.debounce import DebounceSettings
from pilot.xds import types
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.mesh import Ep, cluster_name, endpoint_slice, service, write_mesh
from tests.support.pilot import (
    RunningPilot,
    responses_written,
    running_kube_pilot,
    running_pilot,
)
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, endpoint_ips, node

SERVICES = 500
STREAMS = 200
CHANNELS = 4
TIMEOUT = 30.0


def _name(i: int) -> str:
    return f"svc-{i:03d}"


def _ip(i: int, generation: int = 0) -> str:
    return f"127.{1 + generation}.{i // 250}.{1 + i % 250}"


def _objects(i: int, generation: int = 0) -> list[dict[str, Any]]:
    return [
        service(_name(i)),
        endpoint_slice(_name(i), [Ep(_ip(i, generation))], name=f"{_name(i)}-1"),
    ]


def _mesh(changed: dict[int, int] | None = None) -> list[dict[str, Any]]:
    changed = changed or {}
    return [obj for i in range(SERVICES) for obj in _objects(i, changed.get(i, 0))]


async def _sync(stream: DeltaStream, i: int) -> None:
    """Subscribe like a sidecar: every cluster, and the assignment of service i."""
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.ENDPOINT, [cluster_name(_name(i))])
    seen: set[str] = set()
    while seen != {types.CLUSTER, types.ENDPOINT}:
        response = await stream.next_response(TIMEOUT)
        await stream.ack(response)
        seen.add(response.type_url)


@asynccontextmanager
async def _subscribed(pilot: RunningPilot) -> AsyncIterator[list[DeltaStream]]:
    clients = [XdsClient(pilot.grpc_target) for _ in range(CHANNELS)]
    try:
        streams = [clients[i % CHANNELS].delta_ads() for i in range(STREAMS)]
        await asyncio.gather(*(_sync(stream, i) for i, stream in enumerate(streams)))
        yield streams
    finally:
        for client in clients:
            await client.aclose()


async def _endpoint_update(stream: DeltaStream, i: int, ip: str) -> None:
    response = await stream.next_response(TIMEOUT)
    assert response.type_url == types.ENDPOINT, "an endpoint change must not send clusters"
    held = delta_resources(response)
    assert set(held) == {cluster_name(_name(i))}
    assert endpoint_ips(held[cluster_name(_name(i))].message) == {ip}
    await stream.ack(response)


async def _one_change_costs_one_assignment(
    pilot: RunningPilot, change: Callable[[], Awaitable[None]]
) -> None:
    async with _subscribed(pilot) as streams:
        stats = pilot.discovery.stats
        stats.reset()
        await change()
        await _endpoint_update(streams[7], 7, _ip(7, 1))
        assert dict(stats.serializations) == {types.ENDPOINT: 1}
        assert stats.streams_woken == 1, "only the subscribed stream is woken"
        await responses_written(stats, {types.ENDPOINT: 1})


async def test_file_registry_endpoint_change(tmp_path: Path) -> None:
    async with running_pilot(tmp_path, _mesh()) as pilot:

        async def change() -> None:
            pilot.write(_mesh({7: 1}))

        await _one_change_costs_one_assignment(pilot, change)


@asynccontextmanager
async def _kube_pilot(
    tmp_path: Path, debounce: DebounceSettings | None = None
) -> AsyncIterator[tuple[KubeAPIServer, RunningPilot]]:
    async with KubeAPIServer() as api:
        for obj in _mesh():
            api.apply(obj)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        extra = {"debounce": debounce} if debounce else {}
        async with running_kube_pilot(kubeconfig, **extra) as pilot:
            yield api, pilot


async def test_kubernetes_endpoint_change(tmp_path: Path) -> None:
    async with _kube_pilot(tmp_path) as (api, pilot):

        async def change() -> None:
            api.apply(_objects(7, 1)[1])

        await _one_change_costs_one_assignment(pilot, change)


async def test_a_thousand_events_in_one_window_is_one_push_per_stream(tmp_path: Path) -> None:
    window = DebounceSettings(after=0.5, max_delay=10.0)
    affected = range(10)
    async with _kube_pilot(tmp_path, window) as (api, pilot), _subscribed(pilot) as streams:
        stats = pilot.discovery.stats
        stats.reset()
        for event in range(1000):
            i = affected[event % len(affected)]
            api.apply(_objects(i, 1 + event // len(affected))[1])
        final = 1 + 999 // len(affected)
        await asyncio.gather(*(_endpoint_update(streams[i], i, _ip(i, final)) for i in affected))
        assert stats.pushes == 1
        assert dict(stats.serializations) == {types.ENDPOINT: len(affected)}
        await responses_written(stats, {types.ENDPOINT: len(affected)})


def _west(changed: dict[int, int] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Each service again in the cluster `west`, with an endpoint of its own there."""
    changed = changed or {}
    return {"west": [o for i in range(SERVICES) for o in _objects(i, 100 + changed.get(i, 0))]}


async def test_a_remote_cluster_endpoint_change_costs_one_assignment(tmp_path: Path) -> None:
    """A service merged from two clusters: an endpoint change in one is one assignment,
    with the endpoints of both, to its subscribers only; no cluster is pushed."""
    async with (
        running_pilot(tmp_path, _mesh(), clusters=_west()) as pilot,
        _subscribed(pilot) as streams,
    ):
        stats = pilot.discovery.stats
        stats.reset()
        assert pilot.config is not None
        write_mesh(pilot.config, _mesh(), _west({7: 1}))
        response = await streams[7].next_response(TIMEOUT)
        assert response.type_url == types.ENDPOINT, "an endpoint change sends no clusters"
        held = delta_resources(response)
        assert set(held) == {cluster_name(_name(7))}
        both = {_ip(7), _ip(7, 101)}
        assert endpoint_ips(held[cluster_name(_name(7))].message) == both
        assert dict(stats.serializations) == {types.ENDPOINT: 1}
        assert stats.streams_woken == 1, "only the subscribed stream is woken"


def delta_priorities(payloads: set[bytes]) -> dict[str, int]:
    """address -> priority in the one assignment these bytes encode."""
    (payload,) = payloads
    assignment = endpoint_pb2.ClusterLoadAssignment.FromString(payload)
    return {
        lb.endpoint.address.socket_address.address: group.priority
        for group in assignment.endpoints
        for lb in group.lb_endpoints
    }


# -- locality variants ---------------------------------------------------------------

# Proxies in two localities and one without: svc-007 has an endpoint in each zone and a
# DestinationRule with outlier detection (locality failover, as Istio gives it), so the
# three variants of its assignment differ (the file has no Nodes: region is the cluster
# id, Kubernetes). svc-008 has no rule: one assignment, the same for every locality.
LOCALITIES = {
    "zone-a": base_pb2.Locality(region="Kubernetes", zone="zone-a"),
    "zone-b": base_pb2.Locality(region="Kubernetes", zone="zone-b", sub_zone="rack-1"),
    "none": None,
}
PER_LOCALITY = 2  # streams on svc-007's assignment; one more per locality watches svc-008


FAILOVER = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "DestinationRule",
    "metadata": {"name": _name(7), "namespace": "default"},
    "spec": {"host": _name(7), "trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 5}}},
}


def _zoned_mesh(generation: int = 0, moved: int = 7) -> list[dict[str, Any]]:
    zoned = [
        Ep(_ip(moved, generation), zone="zone-a"),
        Ep(_ip(100 + moved, generation), zone="zone-b"),
    ]
    mesh = [obj for i in range(20) if i != moved for obj in _objects(i)]
    slice_ = endpoint_slice(_name(moved), zoned, name=f"{_name(moved)}-1")
    return [*mesh, service(_name(moved)), slice_, FAILOVER]


def _located_node(where: str, n: int) -> base_pb2.Node:
    located = node(f"sidecar~10.9.0.{n}~p{n}.default~default.svc.cluster.local")
    if LOCALITIES[where] is not None:
        located.locality.CopyFrom(LOCALITIES[where])
    return located


async def _located_sync(stream: DeltaStream, service: int) -> None:
    await stream.subscribe(types.ENDPOINT, [cluster_name(_name(service))])
    await stream.ack(await stream.next_response(TIMEOUT))


async def test_one_change_builds_one_assignment_per_locality_in_use(tmp_path: Path) -> None:
    async with (
        running_pilot(tmp_path, _zoned_mesh()) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        streams: dict[str, list[DeltaStream]] = {}
        for where in LOCALITIES:
            nodes = [_located_node(where, len(streams) * 10 + k) for k in range(PER_LOCALITY + 1)]
            streams[where] = [client.delta_ads(n) for n in nodes]
            await asyncio.gather(
                *(_located_sync(s, 7) for s in streams[where][:PER_LOCALITY]),
                _located_sync(streams[where][PER_LOCALITY], 8),
            )
        stats = pilot.discovery.stats
        stats.reset()
        pilot.write(_zoned_mesh(1))
        payloads: dict[str, set[bytes]] = {}
        for where, located in streams.items():
            for stream in located[:PER_LOCALITY]:
                response = await stream.next_response(TIMEOUT)
                assert [r.name for r in response.resources] == [cluster_name(_name(7))]
                payloads.setdefault(where, set()).add(response.resources[0].resource.value)
                await stream.ack(response)
        assert dict(stats.serializations) == {types.ENDPOINT: len(LOCALITIES)}
        assert stats.streams_woken == PER_LOCALITY * len(LOCALITIES), "svc-008's were woken"
        await responses_written(stats, {types.ENDPOINT: PER_LOCALITY * len(LOCALITIES)})
        assert all(len(same) == 1 for same in payloads.values()), "one locality, one bytes"
        assert len(set.union(*payloads.values())) == len(LOCALITIES)
        zone_a = delta_priorities(payloads["zone-a"])
        assert zone_a == {_ip(7, 1): 0, _ip(107, 1): 1}
        assert delta_priorities(payloads["none"]) == {_ip(7, 1): 0, _ip(107, 1): 0}


async def test_without_a_rule_one_assignment_serves_every_locality(tmp_path: Path) -> None:
    async with (
        running_pilot(tmp_path, _zoned_mesh(moved=8)) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        streams = [client.delta_ads(_located_node(where, n)) for n, where in enumerate(LOCALITIES)]
        await asyncio.gather(*(_located_sync(s, 8) for s in streams))
        stats = pilot.discovery.stats
        stats.reset()
        pilot.write(_zoned_mesh(1, moved=8))
        payloads = set()
        for stream in streams:
            response = await stream.next_response(TIMEOUT)
            payloads.add(response.resources[0].resource.value)
            await stream.ack(response)
        assert dict(stats.serializations) == {types.ENDPOINT: 1}, "one for every locality"
        (payload,) = payloads
        assert delta_priorities({payload}) == {_ip(8, 1): 0, _ip(108, 1): 0}


# -- listeners and routes -------------------------------------------------------------

SIDECARS = 20
PASSTHROUGH = "PassthroughCluster"


async def _sidecar_sync(stream: DeltaStream, i: int) -> None:
    """Subscribe like an Envoy with listeners: every cluster and listener, service i's
    assignment, route configuration 80; until each is answered (and the clusters the
    listeners name)."""
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.ENDPOINT, [cluster_name(_name(i))])
    await stream.subscribe(types.LISTENER, ["*"])
    await stream.subscribe(types.ROUTE, ["80"])
    seen: set[str] = set()
    clusters: set[str] = set()
    while seen != {types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE} or (
        PASSTHROUGH not in clusters
    ):
        response = await stream.next_response(TIMEOUT)
        if response.type_url == types.CLUSTER:
            clusters |= set(delta_resources(response))
        await stream.ack(response)
        seen.add(response.type_url)


@asynccontextmanager
async def _sidecars(pilot: RunningPilot) -> AsyncIterator[list[DeltaStream]]:
    async with XdsClient(pilot.grpc_target) as client:
        streams = [client.delta_ads() for _ in range(SIDECARS)]
        await asyncio.gather(*(_sidecar_sync(stream, i) for i, stream in enumerate(streams)))
        yield streams


async def test_an_endpoint_change_sends_sidecars_no_cluster_listener_or_route(
    tmp_path: Path,
) -> None:
    async with running_pilot(tmp_path, _mesh()) as pilot, _sidecars(pilot) as streams:
        stats = pilot.discovery.stats
        stats.reset()
        pilot.write(_mesh({7: 1}))
        await _endpoint_update(streams[7], 7, _ip(7, 1))
        assert dict(stats.serializations) == {types.ENDPOINT: 1}
        await responses_written(stats, {types.ENDPOINT: 1})  # no CDS, LDS or RDS


def _with_cluster_ip(obj: dict[str, Any], ip: str) -> dict[str, Any]:
    obj["spec"]["clusterIP"] = ip
    return obj


async def test_a_new_service_pushes_clusters_then_listeners_then_routes(tmp_path: Path) -> None:
    new = _with_cluster_ip(service("added", ports=[("http", 80), ("tcp-db", 5432)]), "10.96.0.9")
    async with running_pilot(tmp_path, _mesh()) as pilot, _sidecars(pilot) as streams:
        stats = pilot.discovery.stats
        stats.reset()
        pilot.write([*_mesh(), new])
        for stream in streams:
            order = []
            for _ in range(3):
                response = await stream.next_response(TIMEOUT)
                order.append(response.type_url)
                names = set(delta_resources(response))
                if response.type_url == types.CLUSTER:
                    assert names == {cluster_name("added"), cluster_name("added", 5432)}
                elif response.type_url == types.LISTENER:
                    assert names == {"10.96.0.9_5432"}, "0.0.0.0_80 did not change"
                else:
                    assert names == {"80"}
                await stream.ack(response)
            assert order == [types.CLUSTER, types.LISTENER, types.ROUTE]
        # One route configuration 80 (500 virtual hosts and the new one), once per mode.
        assert stats.serializations[types.ROUTE] == 2
        await responses_written(
            stats, {types.CLUSTER: SIDECARS, types.LISTENER: SIDECARS, types.ROUTE: SIDECARS}
        )


async def test_a_route_only_change_pushes_routes_alone(tmp_path: Path) -> None:
    """A new ClusterIP of an HTTP-only service changes its route domains, nothing else."""
    async with running_pilot(tmp_path, _mesh()) as pilot, _sidecars(pilot) as streams:
        stats = pilot.discovery.stats
        stats.reset()
        mesh = _mesh()
        _with_cluster_ip(mesh[2 * 7], "10.96.0.7")
        pilot.write(mesh)
        for stream in streams:
            response = await stream.next_response(TIMEOUT)
            assert response.type_url == types.ROUTE
            (config,) = delta_resources(response).values()
            hosts = {h.name: list(h.domains) for h in config.message.virtual_hosts}
            assert "10.96.0.7" in hosts[f"{_name(7)}.default.svc.cluster.local:80"]
            await stream.ack(response)
        await responses_written(stats, {types.ROUTE: SIDECARS})
