"""Auto mTLS on the way out: the transport sockets a sidecar's outbound cluster picks from.

Istio's auto mTLS, as a sidecar's cluster carries it: two
`transport_socket_matches`. `tlsMode-istio` matches endpoints whose metadata
says `envoy.transport_socket_match: {tlsMode: istio}` (their pod runs a
sidecar, `pilot.builders.eds`) and speaks mTLS to them: the proxy's own
certificate (`default`) and the trust root (`ROOTCA`), both by SDS from the
bootstrap cluster `sds-grpc`; SNI `outbound_.PORT_._.HOST`; ALPN by the port's
protocol (Istio's `istio-http/1.1`, `istio-h2`, `istio-peer-exchange`, each
then `istio`); and the server must prove one of the SPIFFE identities of the
service's pods' service accounts. `tlsMode-disabled` matches every other
endpoint and speaks plaintext.

A service with no known pod has no identity to accept: its `tlsMode-istio`
socket is still there (an endpoint only picks it once its pod is known, and
then the pod's identity is in the list), with a SAN list that accepts no
certificate rather than any.

Only clusters sent to streams that read listeners carry these (the
`ADS_WITH_LISTENERS` flavor): a gateway or a hand-written listener's Envoy
gets the clusters it got before.
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import config_source_pb2
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import duration_pb2, struct_pb2

from pilot.builders.cds import grpc_source
from pilot.builders.protocols import PortProtocol, protocol_of
from pilot.registry.model import ServiceKey, ServicePort

SDS_CLUSTER = "sds-grpc"  # the bootstrap cluster every sidecar reaches its SDS server by
WORKLOAD_SECRET = "default"
ROOT_SECRET = "ROOTCA"
TLS_MODE_ISTIO = "tlsMode-istio"
TLS_MODE_DISABLED = "tlsMode-disabled"
TLS_SOCKET = "envoy.transport_sockets.tls"
RAW_SOCKET = "envoy.transport_sockets.raw_buffer"
_HTTP1_ALPN = ("istio-http/1.1", "istio")
_H2_ALPN = ("istio-h2", "istio")
_TCP_ALPN = ("istio-peer-exchange", "istio")
_H2_PROTOCOLS = frozenset({PortProtocol.HTTP2, PortProtocol.GRPC, PortProtocol.GRPC_WEB})
_HTTP1_PROTOCOLS = frozenset({PortProtocol.HTTP})

Identity = tuple[str, str]  # (namespace, service account)


def sni(service: ServiceKey, port: ServicePort, cluster_domain: str) -> str:
    """Istio's SNI for a service port: `outbound_.PORT_._.HOST`."""
    return f"outbound_.{port.port}_._.{service.hostname(cluster_domain)}"


def alpn(port: ServicePort) -> tuple[str, ...]:
    """What the client offers, by the destination port's protocol (Istio's names)."""
    protocol = protocol_of(port)
    if protocol in _H2_PROTOCOLS:
        return _H2_ALPN
    if protocol in _HTTP1_PROTOCOLS:
        return _HTTP1_ALPN
    return _TCP_ALPN


def spiffe_id(trust_domain: str, identity: Identity) -> str:
    namespace, account = identity
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{account}"


def sds_config() -> config_source_pb2.ConfigSource:
    """Secrets from `sds-grpc`, as Istio's sidecars fetch them: wait for them (no
    initial fetch timeout), since a cluster without its certificate cannot connect."""
    source = config_source_pb2.ConfigSource(
        resource_api_version=config_source_pb2.V3,
        initial_fetch_timeout=duration_pb2.Duration(seconds=0),
    )
    return grpc_source(source, config_source_pb2.ApiConfigSource.GRPC, SDS_CLUSTER)


def upstream_tls(
    service: ServiceKey,
    port: ServicePort,
    identities: Iterable[Identity],
    *,
    cluster_domain: str,
    trust_domain: str,
) -> tls_pb2.UpstreamTlsContext:
    """The mTLS a sidecar speaks to an endpoint whose pod runs a sidecar."""
    context = tls_pb2.UpstreamTlsContext(sni=sni(service, port, cluster_domain))
    common = context.common_tls_context
    common.tls_params.tls_minimum_protocol_version = common_pb2.TlsParameters.TLSv1_2
    common.tls_params.tls_maximum_protocol_version = common_pb2.TlsParameters.TLSv1_3
    common.alpn_protocols.extend(alpn(port))
    common.tls_certificate_sds_secret_configs.append(
        secret_pb2.SdsSecretConfig(name=WORKLOAD_SECRET, sds_config=sds_config())
    )
    validation = common.combined_validation_context
    validation.validation_context_sds_secret_config.name = ROOT_SECRET
    validation.validation_context_sds_secret_config.sds_config.CopyFrom(sds_config())
    sans = validation.default_validation_context.match_typed_subject_alt_names
    for identity in sorted(identities):
        sans.add(
            san_type=common_pb2.SubjectAltNameMatcher.URI,
            matcher=string_pb2.StringMatcher(exact=spiffe_id(trust_domain, identity)),
        )
    if not sans:
        # No pod known: accept nobody rather than any certificate the root signed.
        sans.add(
            san_type=common_pb2.SubjectAltNameMatcher.URI,
            matcher=string_pb2.StringMatcher(exact=f"spiffe://{trust_domain}/no-known-pod"),
        )
    return context


def transport_socket_matches(
    service: ServiceKey,
    port: ServicePort,
    identities: Iterable[Identity],
    *,
    cluster_domain: str,
    trust_domain: str,
) -> list[cluster_pb2.Cluster.TransportSocketMatch]:
    """`tlsMode-istio` (mTLS) for endpoints labelled so, `tlsMode-disabled` (plaintext) else."""
    tls = upstream_tls(
        service, port, identities, cluster_domain=cluster_domain, trust_domain=trust_domain
    )
    istio = cluster_pb2.Cluster.TransportSocketMatch(
        name=TLS_MODE_ISTIO,
        match=struct_pb2.Struct(fields={"tlsMode": struct_pb2.Value(string_value="istio")}),
    )
    istio.transport_socket.name = TLS_SOCKET
    istio.transport_socket.typed_config.Pack(tls)
    disabled = cluster_pb2.Cluster.TransportSocketMatch(
        name=TLS_MODE_DISABLED, match=struct_pb2.Struct()
    )
    disabled.transport_socket.name = RAW_SOCKET
    disabled.transport_socket.typed_config.Pack(raw_buffer_pb2.RawBuffer())
    return [istio, disabled]
