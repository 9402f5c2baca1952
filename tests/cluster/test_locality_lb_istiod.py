"""pilot's locality load balancing is istiod's, field for field, on one real API server.

Four Nodes labelled as a cloud labels them (eu/a, eu/b, us/c, ap/d) and a Pod of
`shop` on each, run there by the test kubelet; the real EndpointSlice controller
places each endpoint. Six Services select those Pods, each with its own
DestinationRule (through the CRD): none; outlierDetection only; `distribute` (with
a wildcard); `failover` (eu to ap) with outlierDetection; `enabled: false` with
outlierDetection; `failoverPriority` with outlierDetection. istiod
(tools/istiod/build) and pilot each serve a sidecar declaring eu/a, and for every
service but the last the two agree on each locality's priority, its endpoints, its
weight where the cluster balances by locality weights, and on the cluster's
locality_weighted_lb_config. (istiod writes each locality's weight, the number of
its endpoints, even where no cluster reads it; pilot only where Envoy reads it.)

`failoverPriority` orders endpoints by the calling proxy's own pod labels: pilot
refuses it (one warning, `pilot_config_rejected_total`) and serves that service as
with no rule.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from envoy.config.core.v3 import base_pb2

from pilot.xds import types
from tests.cluster.client import Kube, admin
from tests.cluster.control_plane import ControlPlane
from tests.cluster.istiod_server import running_istiod
from tests.cluster.kubelet import ensure_node
from tests.cluster.workloads import (
    SERVICE_PORT,
    Kubelet,
    address,
    ensure_account,
    per_kind,
    pod,
    service,
    watching_pilot,
)
from tests.support.envoy_process import wait_until
from tests.support.xds_client import XdsClient, delta_resources, node

REGION, ZONE = "topology.kubernetes.io/region", "topology.kubernetes.io/zone"
PLACES = {"eu-a": ("eu", "a"), "eu-b": ("eu", "b"), "us-c": ("us", "c"), "ap-d": ("ap", "d")}
TIMEOUT = 60.0
OUTLIERS = {"outlierDetection": {"consecutive5xxErrors": 5}}


def _lb(setting: dict[str, Any]) -> dict[str, Any]:
    return {"loadBalancer": {"localityLbSetting": setting}}


POLICIES: dict[str, dict[str, Any] | None] = {
    "none": None,
    "outliers": OUTLIERS,
    "distribute": _lb({"distribute": [
        {"from": "eu/a", "to": {"eu/a": 60, "us/*": 30, "ap": 10}},
        {"from": "*", "to": {"eu": 100}},
    ]}),
    "failover": {**OUTLIERS, **_lb({"failover": [{"from": "eu", "to": "ap"}]})},
    "disabled": {**OUTLIERS, **_lb({"enabled": False})},
}  # fmt: skip
REFUSED = {**OUTLIERS, **_lb({"failoverPriority": ["topology.istio.io/network"]})}

Placed = dict[tuple[str, str], tuple[int, int | None, frozenset[str]]]


@asynccontextmanager
async def labelled_nodes(kube: Kube, prefix: str) -> AsyncIterator[dict[str, str]]:
    """A Node per place (place -> its name), deleted afterwards."""
    names = {place: f"{prefix}-{place}" for place in PLACES}
    try:
        for place, (region, zone) in PLACES.items():
            await ensure_node(kube, names[place], {REGION: region, ZONE: zone})
        yield names
    finally:
        for name in names.values():
            await kube.delete({"kind": "Node", "metadata": {"name": name}})


def _rule(name: str, namespace: str, policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"host": name, "trafficPolicy": policy},
    }


def _cluster(name: str, namespace: str) -> str:
    return f"outbound|{SERVICE_PORT}||{name}.{namespace}.svc.cluster.local"


async def _served(
    target: str, located: base_pb2.Node, type_url: str, names: set[str]
) -> dict[str, Any]:
    """The resources `names` of `type_url` the server at `target` sends `located`."""
    found: dict[str, Any] = {}
    async with XdsClient(target) as client:
        stream = client.delta_ads(located)
        await stream.subscribe(type_url, ["*"] if type_url == types.CLUSTER else sorted(names))
        while not names <= found.keys():
            response = await stream.next_response(TIMEOUT)
            await stream.ack(response)
            found |= {n: r.message for n, r in delta_resources(response).items() if n in names}
    return found


def _placed(assignment: Any, weighted: bool) -> Placed:
    """locality -> (priority, weight where the cluster reads weights, endpoint addresses)."""
    found: Placed = {}
    for group in assignment.endpoints:
        hosts = frozenset(lb.endpoint.address.socket_address.address for lb in group.lb_endpoints)
        weight = group.load_balancing_weight.value if weighted else None
        found[(group.locality.region, group.locality.zone)] = (group.priority, weight, hosts)
    return found


async def _view(target: str, located: base_pb2.Node, names: dict[str, str]) -> dict[str, Any]:
    """Per service: (the cluster's locality config, its assignment's placements)."""
    clusters = await _served(target, located, types.CLUSTER, set(names.values()))
    assignments = await _served(target, located, types.ENDPOINT, set(names.values()))
    view = {}
    for service_name, cluster_name in names.items():
        specifier = clusters[cluster_name].common_lb_config.WhichOneof("locality_config_specifier")
        weighted = specifier == "locality_weighted_lb_config"
        view[service_name] = (specifier, _placed(assignments[cluster_name], weighted))
    return view


async def test_pilots_locality_load_balancing_is_istiods(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    names = {name: _cluster(f"shop-{name}", namespace) for name in [*POLICIES, "refused"]}
    async with AsyncExitStack() as stack:
        kube = await stack.enter_async_context(admin(deployed))
        nodes = await stack.enter_async_context(labelled_nodes(kube, namespace))
        await ensure_account(kube, namespace)
        kubelet = Kubelet(kube, namespace)
        ips = {
            place: address(await kubelet.run(pod(f"shop-{place}", namespace, "shop"), node))
            for place, node in nodes.items()
        }
        for name, policy in [*POLICIES.items(), ("refused", REFUSED)]:
            await kube.create(service(f"shop-{name}", namespace, app="shop"))
            if policy is not None:
                await kube.create(_rule(f"shop-{name}", namespace, policy))
        theirs_at = await stack.enter_async_context(running_istiod(deployed, kube, tmp_path))
        pilot = await stack.enter_async_context(
            watching_pilot(kube, deployed, tmp_path, (namespace,))
        )
        located = node(f"sidecar~{ips['eu-a']}~shop-eu-a.{namespace}~{namespace}.svc.cluster.local")
        located.locality.region, located.locality.zone = "eu", "a"

        def complete(view: dict[str, Any]) -> bool:  # every Pod placed in every assignment
            return all(
                sum(len(hosts) for _, _, hosts in placed.values()) == len(PLACES)
                or name == "distribute"
                for name, (_, placed) in view.items()
            )

        ours = await wait_until(
            lambda: _view(pilot.grpc_target, located, names), TIMEOUT, "pilot's", until=complete
        )
        theirs = await wait_until(
            lambda: _view(theirs_at, located, names), TIMEOUT, "istiod's", until=complete
        )
        rejected = await per_kind(pilot, "pilot_config_rejected")
    for name in POLICIES:
        assert ours[name] == theirs[name], name
    # What the cases show, beyond agreeing: eu/a first only where failover is on.
    eu_a, eu_b, us_c, ap_d = (("eu", "a"), ("eu", "b"), ("us", "c"), ("ap", "d"))
    priorities = {n: {loc: p for loc, (p, _, _) in ours[n][1].items()} for n in ours}
    assert set(priorities["none"].values()) == {0}
    assert priorities["outliers"] == {eu_a: 0, eu_b: 1, us_c: 2, ap_d: 2}
    assert priorities["failover"] == {eu_a: 0, eu_b: 1, ap_d: 2, us_c: 3}
    assert set(priorities["disabled"].values()) == {0}
    assert ours["distribute"][0] == "locality_weighted_lb_config"
    weights = {loc: w for loc, (_, w, hosts) in ours["distribute"][1].items() if hosts}
    assert weights == {eu_a: 60, us_c: 30, ap_d: 10}
    assert ours["refused"] == ours["none"], "failoverPriority refused: as with no rule"
    assert rejected["DestinationRule"] == 1
