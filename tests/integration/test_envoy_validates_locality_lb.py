"""Envoy accepts whatever pilot makes of a fuzzed localityLbSetting: clusters and assignments.

The registry file holds services with endpoints in two zones of the local cluster
(`Kubernetes`) and in the clusters `west` and `east` (their own regions), each with a
fuzzed DestinationRule (hypothesis): `distribute` with odd localities (`*` in odd
places, empty parts, sub-zones, NUL and newlines) and weights (0, 101, not summing to
100, strings), `failover`, `enabled`, `failoverPriority`, in the rule's policy, its
port-level settings and its subsets, with or without outlier detection. pilot serves
a sidecar declaring `Kubernetes/zone-a`; each EDS cluster it holds, made STATIC with
the assignment pilot sent (priorities, weights, localities without endpoints), goes
into a bootstrap that `envoy --mode validate` must accept. The rules pilot's parser
refuses are refused (their services' clusters carry no locality weights).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pilot.registry.destination_rule import parse_destination_rule
from pilot.registry.istio_config import ConfigError
from pilot.xds import types
from tests.integration.envoy_validation import POD_ID, bootstrap_of
from tests.support.envoy_process import validate_bootstrap
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import running_pilot
from tests.support.xds_client import XdsClient, delta_resources, node

TIMEOUT = 30.0
PORTS = [("http", 9080)]
LOCAL = [Ep("10.44.2.1", zone="zone-a"), Ep("10.44.2.2", zone="zone-b"), Ep("10.44.2.3")]
REMOTE = {"west": [Ep("10.45.2.1", zone="w1")], "east": [Ep("10.46.2.1")]}

_places = st.sampled_from(
    ["Kubernetes", "Kubernetes/zone-a", "Kubernetes/zone-b/*", "west", "west/*", "east/w1",
     "*", "*/a", "a*", "eu//a", "", "x/y/z", "Kubernetes/zone-a\n", "nul\x00", "/", "*/*"]
)  # fmt: skip
_weights = st.one_of(st.integers(-1, 101), st.sampled_from(["50", None, 2**40]))
_good_to = st.sampled_from(
    [{"Kubernetes/zone-a": 80, "Kubernetes/zone-b": 20}, {"*": 100}, {"west": 50, "Kubernetes": 50},
     {"Kubernetes/zone-a/*": 1, "west/*": 99}, {"east": 100}, {"nowhere": 100}]
)  # fmt: skip
_distribute = st.lists(
    st.fixed_dictionaries(
        {"from": _places, "to": st.one_of(_good_to, st.dictionaries(_places, _weights, max_size=3))}
    ),
    max_size=3,
)
_regions = st.sampled_from(["Kubernetes", "west", "east", "", "a/b", "*", "west\n"])
_setting = st.fixed_dictionaries(
    {},
    optional={
        "enabled": st.one_of(st.booleans(), st.just("no")),
        "distribute": _distribute,
        "failover": st.lists(st.fixed_dictionaries({"from": _regions, "to": _regions}), max_size=3),
        "failoverPriority": st.lists(st.text(max_size=5), max_size=2),
    },
)
_lb = st.fixed_dictionaries(
    {"localityLbSetting": _setting},
    optional={"simple": st.sampled_from(["ROUND_ROBIN", "LEAST_REQUEST", "RANDOM"])},
)
_outlier = st.sampled_from([{"consecutive5xxErrors": 1}, {"interval": "1s"}])
_policy = st.fixed_dictionaries(
    {},
    optional={
        "loadBalancer": _lb,
        "outlierDetection": _outlier,
        "portLevelSettings": st.lists(
            st.fixed_dictionaries(
                {"port": st.just({"number": 9080})},
                optional={"loadBalancer": _lb, "outlierDetection": _outlier},
            ),
            max_size=1,
        ),
    },
)
_subsets = st.lists(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["v1", "v2"]), "labels": st.just({"app": "web"})},
        optional={"trafficPolicy": _policy},
    ),
    max_size=2,
    unique_by=lambda s: s["name"],
)
_rules = st.lists(
    st.fixed_dictionaries({"trafficPolicy": _policy, "subsets": _subsets}), min_size=1, max_size=8
)


def _rule(i: int, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": f"r{i}", "namespace": "shop"},
        "spec": {"host": f"svc{i}", **spec},
    }


def _accepted(obj: dict[str, Any]) -> bool:
    try:
        parse_destination_rule(obj, "cluster.local")
    except ConfigError:
        return False
    return True


async def _held(target: str) -> dict[str, dict[str, Any]]:
    """Every cluster, and the assignment of each EDS one, for a sidecar in zone-a."""
    located = node(POD_ID)
    located.locality.region, located.locality.zone = "Kubernetes", "zone-a"
    held: dict[str, dict[str, Any]] = {
        t: {} for t in (types.CLUSTER, types.LISTENER, types.ROUTE, types.ENDPOINT)
    }
    async with XdsClient(target) as client:
        stream = client.delta_ads(located)
        await stream.subscribe(types.CLUSTER, ["*"])
        wanted: set[str] = set()
        while not wanted or not wanted <= held[types.ENDPOINT].keys():
            response = await stream.next_response(TIMEOUT)
            for name, resource in delta_resources(response).items():
                held.setdefault(response.type_url, {})[name] = resource.message
            await stream.ack(response)
            eds = {n for n, c in held[types.CLUSTER].items() if c.type == cluster_pb2.Cluster.EDS}
            if eds - wanted:
                wanted = eds
                await stream.subscribe(types.ENDPOINT, sorted(wanted))
    return held


def _static(held: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The EDS clusters made STATIC with their assignments: Envoy validates both."""
    clusters = {}
    for name, served in held[types.CLUSTER].items():
        cluster = cluster_pb2.Cluster.FromString(served.SerializeToString())
        if name in held[types.ENDPOINT]:
            cluster.ClearField("eds_cluster_config")
            cluster.type = cluster_pb2.Cluster.STATIC
            cluster.load_assignment.CopyFrom(held[types.ENDPOINT][name])
        clusters[name] = cluster
    return {**held, types.CLUSTER: clusters}


# Rules pilot accepts, each kind once, besides what hypothesis draws.
_HONEST = [
    {"trafficPolicy": {"loadBalancer": {"localityLbSetting": {"distribute": [
        {"from": "Kubernetes/zone-a/*", "to": {"Kubernetes/zone-a": 80, "west/*": 20}},
        {"from": "*", "to": {"*": 100}}]}}}},
    {"trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 1}, "loadBalancer": {
        "localityLbSetting": {"failover": [{"from": "Kubernetes", "to": "east"}]}}}},
    {"trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 1}}, "subsets": [
        {"name": "v1", "labels": {"app": "web"}, "trafficPolicy": {"loadBalancer": {
            "localityLbSetting": {"distribute": [{"from": "*", "to": {"east": 100}}]}}}}]},
]  # fmt: skip


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(specs=_rules)
@example(specs=_HONEST)
def test_envoy_validates_fuzzed_locality_settings(tmp_path_factory: Any, specs: list[Any]) -> None:
    tmp_path = tmp_path_factory.mktemp("locality-fuzz")
    objects: list[dict[str, Any]] = []
    remote: dict[str, list[dict[str, Any]]] = {region: [] for region in REMOTE}
    for i, spec in enumerate(specs):
        objects += [
            service(f"svc{i}", "shop", PORTS),
            endpoint_slice(f"svc{i}", LOCAL, "shop", PORTS),
        ]
        for region, endpoints in REMOTE.items():
            there = endpoint_slice(f"svc{i}", endpoints, "shop", PORTS)
            remote[region] += [service(f"svc{i}", "shop", PORTS), there]
        objects.append(_rule(i, spec))
    held = asyncio.run(_validate(tmp_path, objects, remote))
    if specs == _HONEST:
        weighted = {
            name for name, c in held[types.CLUSTER].items()
            if c.common_lb_config.HasField("locality_weighted_lb_config")
        }  # fmt: skip
        host = "shop.svc.cluster.local"
        assert weighted == {f"outbound|9080||svc0.{host}", f"outbound|9080||svc1.{host}",
                            f"outbound|9080|v1|svc2.{host}"}  # fmt: skip


async def _validate(
    tmp_path: Path, objects: list[dict[str, Any]], remote: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    async with running_pilot(tmp_path, objects, clusters=remote) as pilot:
        held = await _held(pilot.grpc_target)

    for obj in objects:
        if obj["kind"] == "DestinationRule" and not _accepted(obj):
            host = f"{obj['spec']['host']}.shop.svc.cluster.local"
            refused = [c for n, c in held[types.CLUSTER].items() if n.endswith(f"|{host}")]
            assert refused and not any(c.common_lb_config.HasField("locality_weighted_lb_config")
                                       for c in refused), host  # fmt: skip
    bootstrap = tmp_path / "bootstrap.pb"
    bootstrap.write_bytes(bootstrap_of(_static(held)).SerializeToString())
    validate_bootstrap(bootstrap)
    return held
