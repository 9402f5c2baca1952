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

from pilot.xds import types
from tests.integration.reviews_counting import (
    HOST,
    follow,
    read_one,
    reviews,
    reviews_routes,
    reviews_subsets,
)
from tests.support.mesh import pod
from tests.support.pilot import responses_written, running_pilot
from tests.support.xds_client import XdsClient, node

# ip -> (namespace, name, labels): the client sidecars' Pods.
CLIENTS = {
    "10.44.0.7": ("shop", "web", {"app": "web"}),
    "10.44.0.8": ("shop", "tester", {"app": "tester"}),
    "10.44.0.9": ("front", "client", {"app": "client"}),
}


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
    clients = [
        pod(name, ip, ns, service_account=name, labels={"app": "tester"} if ip == relabel else lb)
        for ip, (ns, name, lb) in CLIENTS.items()
    ]
    return [*reviews(unready), *clients, reviews_subsets(), *virtual_services]


def subsets(held: dict[str, dict[str, Any]]) -> list[str]:
    """The subset each route of reviews' virtual host sends to, in order."""
    return [r.route.cluster.split("|")[2] for r in reviews_routes(held)]


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
        held = {ip: await follow(streams[ip], ["9080"]) for ip in CLIENTS}
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
