"""`python -m bench.locality_variants`: what proxy localities cost the EDS builder, by rule.

In process, the builder alone (no gRPC): N services of one port and three endpoints in
three zones. For each kind of DestinationRule every service has (none, outlierDetection,
`distribute`), prints, best of `--repeat` runs:

1. building every cluster's assignment: milliseconds;
2. the first proxy of a new locality (its variant of every assignment, on the event
   loop): milliseconds, and assignments encoded;
3. one endpoint change with `--localities` localities in use: assignments encoded.

With no rule (Istio's default: no locality failover) a locality's variant shares the
bytes of the assignment without a locality, so (2) and (3) encode nothing more.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from pilot.builders.settings import BuildSettings
from pilot.generators.eds import EndpointGenerator
from pilot.registry.destination_rule import parse_destination_rule
from pilot.registry.index import EndpointIndex, IndexChange
from pilot.registry.kubernetes_objects import parse_endpoint_slice, parse_service
from pilot.registry.model import ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.locality import Locality
from tests.support.mesh import Ep, endpoint_slice, service

ZONES = ("zone-a", "zone-b", "zone-c")
POLICIES: dict[str, dict[str, Any] | None] = {
    "no rule": None,
    "outlierDetection": {"outlierDetection": {"consecutive5xxErrors": 5}},
    "distribute": {
        "loadBalancer": {
            "localityLbSetting": {
                "distribute": [
                    {"from": "*", "to": {"Kubernetes/zone-a": 80, "Kubernetes/zone-b": 20}}
                ]
            }
        }
    },
}


def _name(i: int) -> str:
    return f"svc-{i:05d}"


def _index(services: int, generation: int = 0) -> EndpointIndex:
    index = EndpointIndex()
    for i in range(services):
        index.upsert_service(parse_service(service(_name(i)), "Kubernetes"))
        index.upsert_endpoints(_slice(i, generation))
    return index


def _slice(i: int, generation: int) -> Any:
    endpoints = [
        Ep(f"10.{1 + z + generation}.{i // 250}.{1 + i % 250}", zone=zone)
        for z, zone in enumerate(ZONES)
    ]
    parsed = parse_endpoint_slice(endpoint_slice(_name(i), endpoints), "Kubernetes")
    assert parsed is not None
    return parsed


def _traffic(services: int, policy: dict[str, Any] | None) -> TrafficConfig:
    traffic = TrafficConfig()
    for i in range(services if policy is not None else 0):
        obj = {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": _name(i), "namespace": "default"},
            "spec": {"host": _name(i), "trafficPolicy": policy},
        }
        traffic.upsert(parse_destination_rule(obj, "cluster.local"))
    return traffic


def _run(services: int, localities: int, policy: dict[str, Any] | None) -> list[float]:
    index, stats = _index(services), XdsStats()
    builder = EndpointGenerator(
        index, ResourceCache(), BuildSettings(), stats, _traffic(services, policy)
    )
    every = frozenset(ServiceKey("default", _name(i)) for i in range(services))
    start = time.perf_counter()
    builder.apply(IndexChange(full=every))
    built = time.perf_counter() - start
    before = stats.serializations[types.ENDPOINT]
    start = time.perf_counter()
    builder.add_locality(Locality("Kubernetes", ZONES[0]))
    joined = time.perf_counter() - start
    encoded_join = stats.serializations[types.ENDPOINT] - before
    for n in range(1, localities):
        builder.add_locality(Locality("Kubernetes", f"extra-{n}"))
    index.upsert_endpoints(_slice(0, 1))
    before = stats.serializations[types.ENDPOINT]
    builder.apply(IndexChange(endpoints=frozenset({ServiceKey("default", _name(0))})))
    encoded_change = stats.serializations[types.ENDPOINT] - before
    return [built * 1000, joined * 1000, encoded_join, encoded_change]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.locality_variants")
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--localities", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    labels = (
        "build every assignment (ms)",
        "a new locality's variants (ms)",
        "a new locality: assignments encoded",
        f"one endpoint change, {args.localities} localities: assignments encoded",
    )
    for kind, policy in POLICIES.items():
        runs = [_run(args.services, args.localities, policy) for _ in range(args.repeat)]
        for column, label in enumerate(labels):
            print(f"{kind}: {label} {min(run[column] for run in runs):g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
