"""Routes that depend on the client, counted: what each change sends, to whom.

Bookinfo's reviews (9080, pods v1, v2, v3, a DestinationRule of those subsets) in
namespace shop, a public VirtualService sending pods labelled `app: tester` to v3 and
everyone else to v1, and one exported to namespace front alone sending front's sidecars
to v2. Three sidecars on delta ADS, each with its Pod in the registry file and the
identity its node metadata gives (`--xds-auth none`): shop's web and tester, front's
client. Changing the one exported to front sends route configuration 9080 to front's
sidecar alone; changing the tester route, to the tester alone (the shared bytes do not
move); relabelling web as a tester, one response to web; an endpoint change,
assignments alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envoy.config.route.v3 import route_pb2

from pilot.xds import types
from tests.support.mesh import Ep, endpoint_slice, pod, service
from tests.support.pilot import responses_written, running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

HOST = "reviews.shop.svc.cluster.local"
PODS = {"10.44.1.1": "v1", "10.44.1.2": "v2", "10.44.1.3": "v3"}
# ip -> (namespace, name, labels): the client sidecars' Pods.
CLIENTS = {
    "10.44.0.7": ("shop", "web", {"app": "web"}),
    "10.44.0.8": ("shop", "tester", {"app": "tester"}),
    "10.44.0.9": ("front", "client", {"app": "client"}),
}
TIMEOUT = 30.0
ASKED = "assignments asked for"


def to(subset: str) -> dict[str, Any]:
    return {"destination": {"host": "reviews", "subset": subset}}


def public(tester: str) -> dict[str, Any]:
    routes = [{"match": [{"sourceLabels": {"app": "tester"}}], "route": [to(tester)]}]
    return _vs("reviews", {"hosts": ["reviews"], "http": [*routes, {"route": [to("v1")]}]})


def for_front(subset: str) -> dict[str, Any]:
    spec = {"hosts": ["reviews"], "exportTo": ["front"], "http": [{"route": [to(subset)]}]}
    return _vs("reviews-front", spec)


def _vs(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": spec,
    }


def mesh(
    *virtual_services: dict[str, Any], unready: str = "", relabel: str = ""
) -> list[dict[str, Any]]:
    slice_ = [Ep(ip, ready=ip != unready, pod=f"reviews-{v}") for ip, v in PODS.items()]
    subsets = [{"name": v, "labels": {"version": v}} for v in ("v1", "v2", "v3")]
    clients = [
        pod(name, ip, ns, service_account=name, labels={"app": "tester"} if ip == relabel else lb)
        for ip, (ns, name, lb) in CLIENTS.items()
    ]
    return [
        service("reviews", "shop", [("http", 9080)]),
        endpoint_slice("reviews", slice_, "shop", [("http", 9080)]),
        *(pod(f"reviews-{v}", ip, "shop", labels={"version": v}) for ip, v in PODS.items()),
        *clients,
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "reviews", "namespace": "shop"},
            "spec": {"host": "reviews", "subsets": subsets},
        },
        *virtual_services,
    ]


async def read_one(stream: DeltaStream, held: dict[str, dict[str, Any]]) -> tuple[str, set[str]]:
    """One response applied (new clusters' assignments asked for): its type and names."""
    response = await stream.next_response(TIMEOUT)
    got = delta_resources(response)
    for name, resource in got.items():
        held.setdefault(response.type_url, {})[name] = resource.message
    await stream.ack(response)
    asked = held.setdefault(ASKED, {})
    eds = sorted(n for n in got if n.startswith("outbound|") and n not in asked)
    if response.type_url == types.CLUSTER and eds:
        asked.update(dict.fromkeys(eds))
        await stream.subscribe(types.ENDPOINT, eds)
    return response.type_url, set(got) | set(response.removed_resources)


async def follow(stream: DeltaStream) -> dict[str, dict[str, Any]]:
    """Subscribe as Envoy does, until the stream holds route configuration 9080 and the
    assignment of every cluster it holds."""
    held: dict[str, dict[str, Any]] = {}
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.LISTENER, ["*"])
    await stream.subscribe(types.ROUTE, ["9080"])

    def done() -> bool:
        clusters = {n for n in held.get(types.CLUSTER, {}) if n.startswith("outbound|")}
        assignments = held.get(types.ENDPOINT, {}).keys()
        return "9080" in held.get(types.ROUTE, {}) and bool(clusters) and clusters <= assignments

    while not done():
        await read_one(stream, held)
    return held


def subsets(held: dict[str, dict[str, Any]]) -> list[str]:
    """The subset each route of reviews' virtual host sends to, in order."""
    config: route_pb2.RouteConfiguration = held[types.ROUTE]["9080"]
    [vhost] = [h for h in config.virtual_hosts if h.name == f"{HOST}:9080"]
    return [r.route.cluster.split("|")[2] for r in vhost.routes]


async def test_client_dependent_changes_push_rds_to_the_sidecars_they_concern_alone(
    tmp_path: Path,
) -> None:
    async with (
        running_pilot(tmp_path, mesh(public("v3"), for_front("v2"))) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        streams = {
            ip: client.delta_ads(
                node(
                    f"sidecar~{ip}~{name}.{ns}~{ns}.svc.cluster.local",
                    {"NAMESPACE": ns, "SERVICE_ACCOUNT": name},
                )
            )
            for ip, (ns, name, _) in CLIENTS.items()
        }
        web, tester, front = "10.44.0.7", "10.44.0.8", "10.44.0.9"
        held = {ip: await follow(streams[ip]) for ip in CLIENTS}
        assert subsets(held[web]) == ["v1"]
        assert subsets(held[tester]) == ["v3", "v1"]
        assert subsets(held[front]) == ["v2"]
        stats = pilot.discovery.stats

        # The one exported to front changes: front's sidecar alone hears of it.
        stats.reset()
        pilot.write(mesh(public("v3"), for_front("v1")))
        assert await read_one(streams[front], held[front]) == (types.ROUTE, {"9080"})
        assert subsets(held[front]) == ["v1"]
        await responses_written(stats, {types.ROUTE: 1})

        # The tester route changes: only the flavor of the testers moves.
        stats.reset()
        pilot.write(mesh(public("v2"), for_front("v1")))
        assert await read_one(streams[tester], held[tester]) == (types.ROUTE, {"9080"})
        assert subsets(held[tester]) == ["v2", "v1"]
        await responses_written(stats, {types.ROUTE: 1})

        # web's Pod relabelled a tester: one route configuration, to web.
        stats.reset()
        pilot.write(mesh(public("v2"), for_front("v1"), relabel=web))
        assert await read_one(streams[web], held[web]) == (types.ROUTE, {"9080"})
        assert subsets(held[web]) == ["v2", "v1"]
        await responses_written(stats, {types.ROUTE: 1})

        # An endpoint not ready: assignments alone, to everyone holding them.
        stats.reset()
        pilot.write(mesh(public("v2"), for_front("v1"), relabel=web, unready="10.44.1.1"))
        for ip in CLIENTS:
            kind, names = await read_one(streams[ip], held[ip])
            assert kind == types.ENDPOINT
            assert f"outbound|9080||{HOST}" in names
        await responses_written(stats, {types.ENDPOINT: 3})
