"""What the bench's processes share: ADS and SDS methods, type URLs, messages, capture files.

A capture file is a sequence of records, each a 4-byte big-endian length and
the raw bytes of one DeltaDiscoveryResponse as a client received it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Final

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

ADS_SERVICE: Final = "envoy.service.discovery.v3.AggregatedDiscoveryService"
ADS_METHOD: Final = "DeltaAggregatedResources"
ADS_PATH: Final = f"/{ADS_SERVICE}/{ADS_METHOD}"
# What a sidecar's `sds-grpc` cluster calls for its certificate and trust root.
SDS_PATH: Final = "/envoy.service.secret.v3.SecretDiscoveryService/DeltaSecrets"
CLUSTER: Final = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT: Final = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER: Final = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE: Final = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
SECRET: Final = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
# Istio's two secrets: the proxy's certificate and key, and the trust root.
WORKLOAD_SECRET: Final = "default"
SECRET_NAMES: Final = (WORKLOAD_SECRET, "ROOTCA")
# Short names for reports, in Istio's push order.
SHORT: Final = {CLUSTER: "CDS", ENDPOINT: "EDS", LISTENER: "LDS", ROUTE: "RDS"}

DeltaRequest = discovery_pb2.DeltaDiscoveryRequest
DeltaResponse = discovery_pb2.DeltaDiscoveryResponse

_LENGTH = struct.Struct(">I")


def node(node_id: str, metadata: Mapping[str, str] | None = None) -> base_pb2.Node:
    """A Node with these string metadata fields (an Istio sidecar's NAMESPACE, ...)."""
    found = base_pb2.Node(id=node_id, cluster="bench")
    for key, value in (metadata or {}).items():
        found.metadata.fields[key].string_value = value
    return found


def subscribe(type_url: str, names: Iterable[str], sender: base_pb2.Node | None = None) -> bytes:
    """A request subscribing to names of one type (with the node on a stream's first one)."""
    request = DeltaRequest(type_url=type_url, resource_names_subscribe=list(names))
    if sender is not None:
        request.node.CopyFrom(sender)
    data: bytes = request.SerializeToString()
    return data


def ack(type_url: str, nonce: str) -> bytes:
    """The ACK of one response, as Envoy sends it."""
    data: bytes = DeltaRequest(type_url=type_url, response_nonce=nonce).SerializeToString()
    return data


def write_records(path: Path, records: Iterable[bytes]) -> None:
    """Write a capture file."""
    with path.open("wb") as out:
        for record in records:
            out.write(_LENGTH.pack(len(record)))
            out.write(record)


def read_records(path: Path) -> Iterator[bytes]:
    """The records of a capture file, in order."""
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        (size,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        yield data[offset : offset + size]
        offset += size
