"""`python -m bench.traffic_rules`: what reading DestinationRules and VirtualServices costs.

Istio's traffic objects are parsed strictly (every field checked, every regex compiled
by RE2): from the file in the parse worker, from the API server on the event loop, one
object per watch event. Prints, best of `--repeat` runs:

1. a registry file of N services (each with its EndpointSlice and Pod) parsed without
   and with a DestinationRule (two subsets, a pool, outlier detection) and a
   VirtualService (a header and regex match, a 80/20 split, timeout, retries) for each
   service: milliseconds, and the difference per service;
2. one of each such object: microseconds each (what an informer's event costs the loop);
3. the costliest VirtualService the bounds allow in two shapes: 256 regexes (the
   regex bound), and 19,000 header matches (near the 20,000-entry bound): milliseconds
   on the loop, the most one watch event can take.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from pilot.registry.destination_rule import parse_destination_rule
from pilot.registry.virtual_service import parse_virtual_service
from pilot.sources.file_format import parse_registry

DOMAIN = "cluster.local"
Obj = dict[str, Any]


def _meta(kind: str, name: str) -> Obj:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "shop"},
    }


def destination_rule(name: str) -> Obj:
    policy = {
        "connectionPool": {"tcp": {"maxConnections": 100}},
        "outlierDetection": {"consecutive5xxErrors": 5, "interval": "10s"},
    }
    subsets = [{"name": v, "labels": {"version": v}} for v in ("v1", "v2")]
    return _meta("DestinationRule", name) | {
        "spec": {"host": name, "trafficPolicy": policy, "subsets": subsets}
    }


def virtual_service(name: str) -> Obj:
    jason = {"headers": {"end-user": {"exact": "jason"}}, "uri": {"regex": "/api/v[0-9]+/.*"}}
    split = [
        {"destination": {"host": name, "subset": "v1"}, "weight": 80},
        {"destination": {"host": name, "subset": "v2"}, "weight": 20},
    ]
    http = [
        {"match": [jason], "route": [{"destination": {"host": name, "subset": "v2"}}]},
        {
            "route": split,
            "timeout": "5s",
            "retries": {"attempts": 3, "perTryTimeout": "2s", "retryOn": "5xx"},
        },
    ]
    return _meta("VirtualService", name) | {"spec": {"hosts": [name], "http": http}}


def registry(services: int, rules: bool) -> str:
    items: list[Obj] = []
    for i in range(services):
        name, ip = f"svc{i}", f"10.{1 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}"
        items += [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": "shop"},
                "spec": {"ports": [{"name": "http", "port": 9080}]},
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": name,
                    "namespace": "shop",
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 9080}],
                "endpoints": [
                    {
                        "addresses": [ip],
                        "targetRef": {"kind": "Pod", "namespace": "shop", "name": name},
                    }
                ],
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "shop", "labels": {"version": "v1"}},
                "spec": {},
                "status": {"phase": "Running", "podIP": ip},
            },
        ]
        if rules:
            items += [destination_rule(name), virtual_service(name)]
    return json.dumps({"kind": "List", "items": items})


def best(repeat: int, run: Callable[[], object]) -> float:
    """The fastest of `repeat` runs, in seconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def costliest() -> tuple[Obj, Obj]:
    """Two VirtualServices at pilot's bounds: regexes, and list entries."""
    regexes = [{"uri": {"regex": f"/(a|b|c)[0-9]{{3}}/{i}/" + "x" * 40}} for i in range(256)]
    headers = [{"headers": {f"h{i}": {"prefix": "x" * 100} for i in range(190)}}] * 100
    route = [{"destination": {"host": "r"}}]
    return (
        _meta("VirtualService", "regexes")
        | {"spec": {"hosts": ["r"], "http": [{"match": regexes, "route": route}]}},
        _meta("VirtualService", "entries")
        | {"spec": {"hosts": ["r"], "http": [{"match": headers, "route": route}]}},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.traffic_rules", description=__doc__)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    n, repeat = args.services, args.repeat
    plain, ruled = registry(n, False), registry(n, True)
    without = best(repeat, lambda: parse_registry(plain, "bench"))
    with_rules = best(repeat, lambda: parse_registry(ruled, "bench"))
    rule, service = destination_rule("svc0"), virtual_service("svc0")
    one_rule = best(repeat * 100, lambda: parse_destination_rule(rule, DOMAIN))
    one_service = best(repeat * 100, lambda: parse_virtual_service(service, DOMAIN))
    regexes, entries = costliest()
    rows = [
        (f"file of {n} services, no rules (ms)", without * 1e3),
        ("  with a DR and a VS each (ms)", with_rules * 1e3),
        ("  per service's two objects (us)", (with_rules - without) / n * 1e6),
        ("one DestinationRule (us)", one_rule * 1e6),
        ("one VirtualService (us)", one_service * 1e6),
        (
            "VirtualService, 256 regexes (ms)",
            best(repeat, lambda: parse_virtual_service(regexes, DOMAIN)) * 1e3,
        ),
        (
            "VirtualService, 19,000 matches (ms)",
            best(repeat, lambda: parse_virtual_service(entries, DOMAIN)) * 1e3,
        ),
    ]
    for label, value in rows:
        print(f"{label:<40} {value:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
