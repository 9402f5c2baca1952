"""Clusters: one EDS cluster per Service port, in one of three config-source flavors,
balanced and bounded as Istio's with no DestinationRule (`pilot.builders.istio_defaults`).

The EDS config source inside a Cluster depends on how the client fetched it:
over ADS it says `ads`; over the standalone CDS service it names the bootstrap
cluster (`--xds-cluster-name`) with the same API type the client used (GRPC or
DELTA_GRPC). Envoy 1.40 rejects `self` for EDS, so it is never used.
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import config_source_pb2, grpc_service_pb2, protocol_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import any_pb2, duration_pb2

from pilot.builders.istio_defaults import apply_outbound_defaults
from pilot.builders.naming import outbound_cluster_name, subset_cluster_name
from pilot.registry.model import Service, ServicePort
from pilot.xds.flavor import Flavor

CONNECT_TIMEOUT_SECONDS = 10  # Istio's default connectTimeout
HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_H2_APP_PROTOCOLS = frozenset({"grpc", "http2", "h2c", "kubernetes.io/h2c"})
_H2_NAME_PREFIXES = ("grpc", "http2", "h2c")


def eds_config_source(flavor: Flavor, xds_cluster_name: str) -> config_source_pb2.ConfigSource:
    """Where a cluster's ClusterLoadAssignment comes from, for this kind of client."""
    source = config_source_pb2.ConfigSource(resource_api_version=config_source_pb2.V3)
    if flavor is Flavor.ADS:
        source.ads.SetInParent()
        return source
    api_type = (
        config_source_pb2.ApiConfigSource.GRPC
        if flavor is Flavor.GRPC
        else config_source_pb2.ApiConfigSource.DELTA_GRPC
    )
    return grpc_source(source, api_type, xds_cluster_name)


def grpc_source(
    source: config_source_pb2.ConfigSource,
    api_type: config_source_pb2.ApiConfigSource.ApiType.ValueType,
    cluster_name: str,
) -> config_source_pb2.ConfigSource:
    """`source`, reading from the bootstrap cluster `cluster_name` over gRPC (v3, the node
    sent on the first request only)."""
    api = source.api_config_source
    api.api_type = api_type
    api.transport_api_version = config_source_pb2.V3
    api.set_node_on_first_message_only = True
    api.grpc_services.append(
        grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=cluster_name)
        )
    )
    return source


def speaks_http2(port: ServicePort) -> bool:
    """Istio's protocol selection, for the part that changes the cluster: gRPC/HTTP2 ports."""
    name = port.name.lower()
    return port.app_protocol.lower() in _H2_APP_PROTOCOLS or name.startswith(_H2_NAME_PREFIXES)


def http2_options() -> any_pb2.Any:
    """Upstream HTTP/2 (`typed_extension_protocol_options[HTTP_OPTIONS_KEY]`)."""
    options = http_protocol_options_pb2.HttpProtocolOptions()
    options.explicit_http_config.http2_protocol_options.CopyFrom(
        protocol_pb2.Http2ProtocolOptions()
    )
    packed = any_pb2.Any()
    packed.Pack(options)
    return packed


def build_cluster(
    name: str, port: ServicePort, flavor: Flavor, xds_cluster_name: str
) -> cluster_pb2.Cluster:
    """The Cluster for one Service port."""
    cluster = cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.EDS,
        connect_timeout=duration_pb2.Duration(seconds=CONNECT_TIMEOUT_SECONDS),
    )
    apply_outbound_defaults(cluster)
    cluster.eds_cluster_config.eds_config.CopyFrom(eds_config_source(flavor, xds_cluster_name))
    if speaks_http2(port):
        cluster.typed_extension_protocol_options[HTTP_OPTIONS_KEY].CopyFrom(http2_options())
    return cluster


def served_ports(service: Service) -> list[ServicePort]:
    """The ports that become clusters: TCP ones (Envoy clusters here are TCP)."""
    return [p for p in service.ports if p.protocol.upper() == "TCP"]


def served_port_names(service: Service | None, cluster_domain: str) -> dict[str, int]:
    """The cluster (and assignment) name of each port served, to its index in the Service."""
    if service is None:
        return {}
    return {
        outbound_cluster_name(service.key, port, cluster_domain): i
        for i, port in enumerate(service.ports)
        if port in served_ports(service)
    }


def cluster_names(
    service: Service | None, subsets: Iterable[str], cluster_domain: str
) -> dict[str, tuple[int, str]]:
    """Each cluster (and assignment) name of a service: its served ports' and, for each
    of them, one per subset; to (the port's index in the Service, the subset or "")."""
    names = {name: (i, "") for name, i in served_port_names(service, cluster_domain).items()}
    if service is None:
        return names
    for i, port in enumerate(service.ports):
        if port in served_ports(service):
            for subset in subsets:
                names[subset_cluster_name(service.key, port, subset, cluster_domain)] = (i, subset)
    return names
