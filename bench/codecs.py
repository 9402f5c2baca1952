"""`python -m bench.codecs`: one ClusterLoadAssignment of N endpoints through each codec.

pilot's wire path uses protobuf (upb, with the classes xds-protos generates) and,
for ClusterLoadAssignments, bytes it assembles by hand from cached per-endpoint
encodings (`pilot.builders.eds`). envoy-data-plane (betterproto2 dataclasses
generated from Envoy's API, pydantic-validated) serves the tests as an
independent decoder. This measures what each would cost on the wire path, on
the same input: one Service port's EndpointSlice of N endpoints (`--endpoints`,
1,000) in three zones, one in ten serving but terminating (DRAINING).

In one run, each operation is timed R times (`--repetitions`) with the garbage
collector off during each timing (as `timeit` does), after one untimed warm-up;
the table gives medians and their ratio to protobuf:

- build + serialize, from the registry's endpoint set to wire bytes. Every codec
  starts the same way: pilot's `collect_hosts`, sorted and grouped by zone. Then
  - protobuf: message objects, `SerializeToString(deterministic=True)`;
  - pilot's hand encoder (`encode_load_assignment`) with its per-endpoint cache
    emptied first, as on a first push;
  - the same with one endpoint moved since the last push, so N-1 endpoints come
    from the cache: pilot's steady state;
  - envoy-data-plane: dataclasses, `bytes()`.
- parse, the bytes back into objects: protobuf `FromString`, envoy-data-plane
  `parse`. upb decodes into its arena and makes Python objects only when a field
  is read; betterproto2 builds (and validates) every dataclass at once. So also:
- parse + read, the same and then every endpoint's address, port and health.

pilot parses no response it sends; the hand encoder has no parser.

Every codec must produce exactly the same bytes (the last column); if one does
not, the exit status is 1.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf.internal import api_implementation

from pilot.builders import eds
from pilot.builders.eds import collect_hosts, encode_load_assignment
from pilot.registry.model import (
    Endpoint,
    EndpointGroup,
    EndpointPort,
    EndpointSet,
    EndpointSetKey,
    Health,
    ServiceKey,
    ServicePort,
)

with warnings.catch_warnings():
    # envoy-data-plane 2.2.0's generated validators use a form pydantic 2.12 deprecates.
    warnings.simplefilter("ignore", DeprecationWarning)
    from envoy_data_plane.envoy.config.core import v3 as edp_core
    from envoy_data_plane.envoy.config.endpoint import v3 as edp_endpoint

SERVICE = ServiceKey("default", "bench")
PORT = ServicePort("http", 80)
CLUSTER = "outbound|80||bench.default.svc.cluster.local"
ZONES = ("zone-a", "zone-b", "zone-c")
PB_HEALTH = {Health.HEALTHY: health_check_pb2.HEALTHY, Health.DRAINING: health_check_pb2.DRAINING}
EDP_HEALTH = {
    Health.HEALTHY: edp_core.HealthStatus.HEALTHY,
    Health.DRAINING: edp_core.HealthStatus.DRAINING,
}

Hosts = dict[str, list[tuple[str, int, Health]]]


def _address(i: int) -> str:
    return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"


def endpoint_set(count: int, moved: int | None = None, to: int = 0) -> EndpointSet:
    """`count` endpoints at port 8080; endpoint `moved`, if given, at the `to`-th new address."""
    endpoints = tuple(
        Endpoint(
            (_address(count + to if i == moved else i),),
            ready=i % 10 != 0,
            serving=True,
            terminating=i % 10 == 0,
            zone=ZONES[i % len(ZONES)],
        )
        for i in range(count)
    )
    group = EndpointGroup((EndpointPort("http", 8080),), endpoints)
    return EndpointSet(EndpointSetKey("EndpointSlice", "default", "bench-1"), SERVICE, (group,))


def grouped(endpoint_set: EndpointSet) -> Hosts:
    """zone -> (address, port, health), sorted: the first step of every codec here."""
    by_zone: Hosts = {}
    hosts = sorted(collect_hosts(PORT, [endpoint_set]).items())
    for (address, number), (health, locality, *_) in hosts:
        by_zone.setdefault(locality.zone, []).append((address, number, health))
    return {zone: by_zone[zone] for zone in sorted(by_zone)}


def protobuf_bytes(endpoint_set: EndpointSet) -> bytes:
    message = endpoint_pb2.ClusterLoadAssignment(cluster_name=CLUSTER)
    for zone, hosts in grouped(endpoint_set).items():
        locality = message.endpoints.add()
        locality.locality.zone = zone
        for address, number, health in hosts:
            lb_endpoint = locality.lb_endpoints.add(health_status=PB_HEALTH[health])
            socket_address = lb_endpoint.endpoint.address.socket_address
            socket_address.address = address
            socket_address.port_value = number
    return bytes(message.SerializeToString(deterministic=True))


def _edp_lb_endpoint(address: str, number: int, health: Health) -> edp_endpoint.LbEndpoint:
    socket_address = edp_core.SocketAddress(address=address, port_value=number)
    endpoint = edp_endpoint.Endpoint(address=edp_core.Address(socket_address=socket_address))
    return edp_endpoint.LbEndpoint(endpoint=endpoint, health_status=EDP_HEALTH[health])


def edp_bytes(endpoint_set: EndpointSet) -> bytes:
    localities = [
        edp_endpoint.LocalityLbEndpoints(
            locality=edp_core.Locality(zone=zone),
            lb_endpoints=[_edp_lb_endpoint(*host) for host in hosts],
        )
        for zone, hosts in grouped(endpoint_set).items()
    ]
    return bytes(edp_endpoint.ClusterLoadAssignment(cluster_name=CLUSTER, endpoints=localities))


def hand_bytes(endpoint_set: EndpointSet) -> bytes:
    return encode_load_assignment(CLUSTER, PORT, [endpoint_set])


def hand_bytes_first_push(endpoint_set: EndpointSet) -> bytes:
    eds._encoded_lb_endpoint.cache_clear()  # nothing encoded yet
    return hand_bytes(endpoint_set)


def read_hosts(assignment: Any) -> list[tuple[str, int, object]]:
    """Every endpoint's address, port and health (the attribute names are the same in both)."""
    hosts = []
    for locality in assignment.endpoints:
        for lb_endpoint in locality.lb_endpoints:
            socket_address = lb_endpoint.endpoint.address.socket_address
            hosts.append(
                (socket_address.address, socket_address.port_value, lb_endpoint.health_status)
            )
    return hosts


def parse_and_read(parse: Callable[[bytes], object]) -> Callable[[bytes], object]:
    return lambda wire: read_hosts(parse(wire))


def median_seconds(
    operation: Callable[[Any], object], inputs: Sequence[Any], warm_up: Any = None
) -> float:
    """The median time of `operation` over `inputs`, one call each, after an untimed
    call on `warm_up` (default: the first input)."""
    operation(inputs[0] if warm_up is None else warm_up)
    times = []
    for item in inputs:
        gc.disable()
        try:
            started = time.perf_counter()
            operation(item)
            times.append(time.perf_counter() - started)
        finally:
            gc.enable()
    return statistics.median(times)


@dataclass(frozen=True)
class Row:
    codec: str
    serialize: float  # seconds, median
    parse: float | None  # seconds, median; None: the codec has no parser
    parse_read: float | None
    same_bytes: bool


def measure(count: int, repetitions: int) -> tuple[list[Row], int]:
    """Every codec's row, and the size of the assignment in bytes."""
    base = endpoint_set(count)
    reference = protobuf_bytes(base)
    same, wire = repetitions * [base], repetitions * [reference]
    # Each steady-state push follows the one before: endpoint r % count moved to a new address.
    moves = [endpoint_set(count, moved=r % count, to=r) for r in range(repetitions + 1)]
    hand_bytes(base)  # the cache as pilot's last push left it
    pb_parse = endpoint_pb2.ClusterLoadAssignment.FromString
    edp_parse = edp_endpoint.ClusterLoadAssignment.parse
    return [
        Row(
            "protobuf (upb)",
            median_seconds(protobuf_bytes, same),
            median_seconds(pb_parse, wire),
            median_seconds(parse_and_read(pb_parse), wire),
            True,
        ),
        Row(
            "pilot's hand encoder, first push",
            median_seconds(hand_bytes_first_push, same),
            None,
            None,
            hand_bytes_first_push(base) == reference,
        ),
        Row(
            "pilot's hand encoder, 1 endpoint moved",
            median_seconds(hand_bytes, moves[1:], warm_up=moves[0]),
            None,
            None,
            all(hand_bytes(move) == protobuf_bytes(move) for move in moves[-2:]),
        ),
        Row(
            "envoy-data-plane (betterproto2)",
            median_seconds(edp_bytes, same),
            median_seconds(edp_parse, wire),
            median_seconds(parse_and_read(edp_parse), wire),
            edp_bytes(base) == reference and bytes(edp_parse(reference)) == reference,
        ),
    ], len(reference)


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3g} ms"


def _times(seconds: float | None, reference: float | None) -> str:
    if seconds is None or not reference:
        return "—"
    return f"{seconds / reference:.1f}x"


def render_table(rows: list[Row]) -> str:
    protobuf = rows[0]
    lines = [
        "| codec | build + serialize | vs protobuf | parse | vs protobuf "
        "| parse + read | vs protobuf | same bytes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [row.codec]
        for seconds, reference in (
            (row.serialize, protobuf.serialize),
            (row.parse, protobuf.parse),
            (row.parse_read, protobuf.parse_read),
        ):
            cells += [_ms(seconds), _times(seconds, reference)]
        cells.append("yes" if row.same_bytes else "NO")
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def versions() -> str:
    def version(name: str) -> str:
        return f"{name} {importlib.metadata.version(name)}"

    libraries = ", ".join(
        version(name) for name in ("protobuf", "xds-protos", "envoy-data-plane", "betterproto2")
    )
    python = ".".join(str(part) for part in sys.version_info[:3])
    return f"Python {python}, {libraries} (protobuf backend: {api_implementation.Type()})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.codecs", description=__doc__)
    parser.add_argument("--endpoints", type=int, default=1000, help="endpoints (1,000)")
    parser.add_argument("--repetitions", type=int, default=20, help="timings per operation (20)")
    args = parser.parse_args(argv)
    if args.endpoints < 1 or args.repetitions < 1:
        parser.error("--endpoints and --repetitions must be at least 1")
    rows, size = measure(args.endpoints, args.repetitions)
    print(
        f"ClusterLoadAssignment of {args.endpoints:,} endpoints in {len(ZONES)} zones, "
        f"{size:,} bytes; median of {args.repetitions} timings per operation"
    )
    print(versions())
    print(render_table(rows))
    return 0 if all(row.same_bytes for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
