"""A sidecar's inbound side: the `virtualInbound` listener and `inbound|P||` clusters (pure).

What a captured connection to the pod meets (iptables sends it to 15006):
`virtualInbound` on 0.0.0.0:15006 restores its original destination
(`original_dst`), reads whether it is TLS and its ALPN (`tls_inspector`) or
plaintext HTTP (`http_inspector`, not on the workload's TCP ports), and picks
a filter chain by destination port, Istio's way:

- per workload port P (`InboundShape.ports`), in that port's mode
  (`InboundShape.mode_at`), an mTLS chain (transport `tls`,
  Istio's ALPN: HTTP chains `istio-http/1.0`, `istio-http/1.1`, `istio-h2`,
  TCP chains `istio-peer-exchange`, `istio`) that requires a client
  certificate from pilot's CA (SDS `default` and `ROOTCA` from `sds-grpc`),
  unless the mode is DISABLE; and a plaintext chain (transport `raw_buffer`,
  HTTP ones by http_inspector's `http/1.1` / `h2c`) in PERMISSIVE and DISABLE,
  none in STRICT;
- per port a PeerAuthentication gives its own mode but no service names
  (`portLevelMtls`), the same pair as passthrough chains (the mTLS one takes
  every Istio ALPN, HTTP or TCP, and proxies the bytes) matched on that port,
  in that mode, to `InboundPassthroughCluster`, as Istio adds them;
- for every other port, the passthrough pair without a port, in the
  workload's own mode; and a chain for 15006 itself to `BlackHoleCluster`, so
  nothing loops into the listener.

A workload port, or a port-level one, is never one of the sidecar's own
(`pilot.builders.proxy_ports`; `pilot.generators.inbound_proxies` leaves them
out of the shape's ports, and `InboundShape.passthrough_ports` out of the
port-level chains): a chain there could outrank the blackhole (a TLS chain on
15006 is more specific) or forward to Envoy's own listener. What the
passthrough does with those ports, under the capture rules
(`pilot.agent.iptables`): 15020, 15021 and 15090 are not captured at all; 15006
meets the blackhole; 15001 is passed to the pod's 15001 from 127.0.0.6 (never
captured again), where `virtualOutbound`'s own blackhole ends it; 15000 is
refused (the admin API listens on 127.0.0.1 only).

HTTP chains of a workload some RequestAuthentication applies to verify JWTs first
(`pilot.builders.jwt_authn`: a failing token is refused with 401), before the RBAC
filters, which match request principals on what it verified. Each `jwksUri` gets a
cluster of its own beside the inbound ones (`jwks_clusters`).

HTTP chains run a connection manager whose one route sends everything to
`inbound|P||` (with Istio's inbound retry, `pilot.builders.istio_defaults`,
except on gRPC ports), and replace `x-forwarded-client-cert` with the peer's SPIFFE
URI (SANITIZE_SET): a plaintext client cannot forge one. TCP chains proxy.
The clusters are ORIGINAL_DST from 127.0.0.6, which the capture rules let
through to the app (`pilot.agent.iptables`), so the app is reached on the
address the client dialled.

Everything here is a function of the `InboundShape` alone: proxies of one
shape share one serialized listener.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import (
    base_pb2,
)
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.listener.http_inspector.v3 import http_inspector_pb2
from envoy.extensions.filters.listener.original_dst.v3 import original_dst_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2, tls_pb2
from envoy.type.v3 import range_pb2
from google.protobuf import duration_pb2, wrappers_pb2
from google.protobuf.message import Message

from pilot.builders.cds import CONNECT_TIMEOUT_SECONDS, HTTP_OPTIONS_KEY, http2_options
from pilot.builders.istio_defaults import inbound_retry_policy, lift_circuit_breakers
from pilot.builders.jwt_authn import jwks_cluster, jwt_authn_filters
from pilot.builders.listeners import router_filter, socket_address, tcp_proxy_filter, typed
from pilot.builders.mtls import sds_config
from pilot.builders.outbound import ANY_ADDRESS, BLACKHOLE_CLUSTER
from pilot.builders.path_normalization import PathNormalization, normalize_paths
from pilot.builders.protocols import PortProtocol, protocol_of
from pilot.builders.proxy_ports import VIRTUAL_INBOUND_PORT, reserved
from pilot.builders.rbac import applied_names, http_rbac_filters, network_rbac_filters
from pilot.registry.authorization_policy import NO_POLICIES, AppliedPolicies
from pilot.registry.model import ServicePort
from pilot.registry.peer_authentication import MtlsMode
from pilot.registry.request_authentication import NO_AUTHENTICATIONS, AppliedAuthentications

VIRTUAL_INBOUND = "virtualInbound"
HTTP_CONNECTION_MANAGER = "envoy.filters.network.http_connection_manager"
# Which AuthorizationPolicies a chain's RBAC filters come from (for proxy-config): on
# the chains, not the listener, whose own change would make Envoy drain all of it.
METADATA_KEY = "pilot"
AUTHZ_METADATA = "authorization_policies"
JWT_METADATA = "request_authentications"
INBOUND_PASSTHROUGH_CLUSTER = "InboundPassthroughCluster"
INBOUND_SOURCE_ADDRESS = "127.0.0.6"  # Envoy's source toward the app; the capture rules RETURN it
WORKLOAD_SECRET = "default"
ROOT_SECRET = "ROOTCA"
HTTP_MTLS_ALPN = ("istio-http/1.0", "istio-http/1.1", "istio-h2")
TCP_MTLS_ALPN = ("istio-peer-exchange", "istio")
HTTP_PLAINTEXT_ALPN = ("http/1.1", "h2c")
DOWNSTREAM_ALPN = ("h2", "http/1.1")


class InboundProtocol(StrEnum):
    """What the app speaks on one of its ports, as far as the inbound side cares."""

    HTTP = "http"  # HTTP/1.1 (and h2c by upgrade): routed, XFCC set
    HTTP2 = "http2"  # HTTP/2: routed, the app is spoken to in HTTP/2
    GRPC = "grpc"  # gRPC, gRPC-Web: as HTTP2, but a reset stream is never sent again
    TCP = "tcp"  # anything else: proxied


def inbound_protocol(port: ServicePort) -> InboundProtocol | None:
    """A service port's inbound protocol by Istio's protocol selection (None: UDP, SCTP)."""
    protocol = protocol_of(port)
    if protocol is PortProtocol.UDP:
        return None
    if protocol in (PortProtocol.GRPC, PortProtocol.GRPC_WEB):
        return InboundProtocol.GRPC
    if protocol is PortProtocol.HTTP2:
        return InboundProtocol.HTTP2
    if protocol is PortProtocol.HTTP:
        return InboundProtocol.HTTP
    return InboundProtocol.TCP


@dataclass(frozen=True, slots=True, order=True)
class InboundShape:
    """What a sidecar's inbound listener is made of: its workload ports, its own mode, and
    the ports whose mode differs from it (PeerAuthentication's port-level modes)."""

    ports: tuple[tuple[int, InboundProtocol], ...]  # sorted by port, one protocol each
    mode: MtlsMode
    port_modes: tuple[tuple[int, MtlsMode], ...] = ()  # sorted; only where not `mode`
    # The AuthorizationPolicies that apply to the workload (RBAC filters on every chain).
    authz: AppliedPolicies = NO_POLICIES
    # The RequestAuthentications that apply to it (jwt_authn on its HTTP chains).
    jwt: AppliedAuthentications = NO_AUTHENTICATIONS

    def mode_at(self, port: int) -> MtlsMode:
        return dict(self.port_modes).get(port, self.mode)

    @property
    def passthrough_ports(self) -> list[tuple[int, MtlsMode]]:
        """Port-level modes on ports no service names (never the sidecar's own)."""
        named = {port for port, _ in self.ports}
        return [
            (port, mode)
            for port, mode in self.port_modes
            if port not in named and not reserved(port)
        ]


def takes_mtls(mode: MtlsMode) -> bool:
    return mode is not MtlsMode.DISABLE


def takes_plaintext(mode: MtlsMode) -> bool:
    return mode is not MtlsMode.STRICT


def inbound_cluster_name(port: int) -> str:
    """Istio's `inbound|PORT||`."""
    return f"inbound|{port}||"


def _sds(name: str) -> secret_pb2.SdsSecretConfig:
    """A secret from the bootstrap's `sds-grpc` cluster, as Istio's sidecars read them."""
    return secret_pb2.SdsSecretConfig(name=name, sds_config=sds_config())


def downstream_tls(http: bool) -> tls_pb2.DownstreamTlsContext:
    """mTLS toward the peer: pilot's workload certificate, a client certificate required
    and checked against pilot's root."""
    common = tls_pb2.CommonTlsContext(
        tls_certificate_sds_secret_configs=[_sds(WORKLOAD_SECRET)],
        validation_context_sds_secret_config=_sds(ROOT_SECRET),
        alpn_protocols=list(DOWNSTREAM_ALPN) if http else [],
    )
    return tls_pb2.DownstreamTlsContext(
        common_tls_context=common,
        require_client_certificate=wrappers_pb2.BoolValue(value=True),
    )


def _tls_socket(http: bool) -> base_pb2.TransportSocket:
    return base_pb2.TransportSocket(
        name="envoy.transport_sockets.tls", typed_config=typed(downstream_tls(http))
    )


def _http_manager(
    stat_prefix: str,
    cluster: str,
    retry: bool,
    authz: AppliedPolicies,
    *,
    normalization: PathNormalization,
    jwt: AppliedAuthentications = NO_AUTHENTICATIONS,
) -> listener_components_pb2.Filter:
    """Every request to `cluster` that the JWT and RBAC filters let through (sent again if the app
    reset it unsent, unless gRPC, as Istio); XFCC replaced by the peer certificate's URI;
    paths normalized as istiod does for `normalization` (`pilot.builders.path_normalization`)
    before anything matches them."""
    action = route_components_pb2.RouteAction(
        cluster=cluster, timeout=duration_pb2.Duration(seconds=0)
    )
    # No stream limit, and a gRPC client's grpc-timeout header honoured, as istiod's.
    action.max_stream_duration.max_stream_duration.SetInParent()
    action.max_stream_duration.grpc_timeout_header_max.SetInParent()
    if retry:
        action.retry_policy.CopyFrom(inbound_retry_policy())
    route = route_components_pb2.Route(
        match=route_components_pb2.RouteMatch(prefix="/"), route=action, name="default"
    )
    host = route_components_pb2.VirtualHost(
        name=f"inbound|http|{stat_prefix}", domains=["*"], routes=[route]
    )
    manager = hcm_pb2.HttpConnectionManager(
        stat_prefix=stat_prefix,
        route_config=route_pb2.RouteConfiguration(name=cluster, virtual_hosts=[host]),
        http_filters=[
            *jwt_authn_filters(jwt),
            *http_rbac_filters(authz, jwt.issuers),
            router_filter(),
        ],
        forward_client_cert_details=hcm_pb2.HttpConnectionManager.SANITIZE_SET,
        set_current_client_cert_details=hcm_pb2.HttpConnectionManager.SetCurrentClientCertDetails(
            uri=True
        ),
        use_remote_address=wrappers_pb2.BoolValue(value=False),
    )
    normalize_paths(manager, normalization)
    return listener_components_pb2.Filter(
        name="envoy.filters.network.http_connection_manager", typed_config=typed(manager)
    )


def _chain(
    name: str,
    port: int | None,
    tls: bool,
    protocol: InboundProtocol,
    cluster: str,
    *,
    authz: AppliedPolicies = NO_POLICIES,
    normalization: PathNormalization = PathNormalization.BASE,
    jwt: AppliedAuthentications = NO_AUTHENTICATIONS,
) -> listener_components_pb2.FilterChain:
    """One chain: matched by port (None: any), TLS or plaintext, HTTP or TCP."""
    http = protocol is not InboundProtocol.TCP
    match = listener_components_pb2.FilterChainMatch(
        transport_protocol="tls" if tls else "raw_buffer"
    )
    if port is not None:
        match.destination_port.value = port
    if tls and cluster == INBOUND_PASSTHROUGH_CLUSTER:  # a peer of any protocol, as TCP
        match.application_protocols.extend(HTTP_MTLS_ALPN + TCP_MTLS_ALPN)
    elif tls:
        match.application_protocols.extend(HTTP_MTLS_ALPN if http else TCP_MTLS_ALPN)
    elif http:
        match.application_protocols.extend(HTTP_PLAINTEXT_ALPN)
    stat_prefix = cluster
    if http:
        retry = protocol is not InboundProtocol.GRPC
        filters = [
            _http_manager(stat_prefix, cluster, retry, authz, normalization=normalization, jwt=jwt)
        ]
    else:
        filters = [
            *network_rbac_filters(authz),
            tcp_proxy_filter(stat_prefix, cluster),
        ]
    chain = listener_components_pb2.FilterChain(
        name=name, filter_chain_match=match, filters=filters
    )
    if tls:
        chain.transport_socket.CopyFrom(_tls_socket(http))
    return chain


def _port_chains(
    shape: InboundShape, port: int, protocol: InboundProtocol, normalization: PathNormalization
) -> list[listener_components_pb2.FilterChain]:
    cluster = inbound_cluster_name(port)
    mode = shape.mode_at(port)
    chains = []
    for tls, suffix in ((True, "mtls"), (False, "plaintext")):
        if takes_mtls(mode) if tls else takes_plaintext(mode):
            chains.append(
                _chain(
                    f"{cluster}-{suffix}",
                    port,
                    tls,
                    protocol,
                    cluster,
                    authz=shape.authz,
                    normalization=normalization,
                    jwt=shape.jwt,
                )
            )
    return chains


def _passthrough_chains(
    name: str, port: int | None, mode: MtlsMode, authz: AppliedPolicies
) -> list[listener_components_pb2.FilterChain]:
    """Ports no service names (on `port`, or any): forwarded to their original
    destination, in `mode`, through the network RBAC filters (as TCP, as Istio)."""
    chains = []
    tcp, cluster = InboundProtocol.TCP, INBOUND_PASSTHROUGH_CLUSTER
    if takes_mtls(mode):
        chains.append(_chain(f"{name}-mtls", port, True, tcp, cluster, authz=authz))
    if takes_plaintext(mode):
        chains.append(_chain(name, port, False, tcp, cluster, authz=authz))
    return chains


def _blackhole_chain() -> listener_components_pb2.FilterChain:
    """A connection to 15006 itself goes nowhere (never back into this listener)."""
    return listener_components_pb2.FilterChain(
        name=f"{VIRTUAL_INBOUND}-blackhole",
        filter_chain_match=listener_components_pb2.FilterChainMatch(
            destination_port=wrappers_pb2.UInt32Value(value=VIRTUAL_INBOUND_PORT)
        ),
        filters=[tcp_proxy_filter(BLACKHOLE_CLUSTER, BLACKHOLE_CLUSTER)],
    )


def _listener_filter(name: str, config: Message) -> listener_components_pb2.ListenerFilter:
    return listener_components_pb2.ListenerFilter(name=name, typed_config=typed(config))


def _on_ports(ports: list[int]) -> listener_components_pb2.ListenerFilterChainMatchPredicate:
    """Connections to any of `ports` (as Istio disables http_inspector on TCP ports)."""
    Predicate = listener_components_pb2.ListenerFilterChainMatchPredicate
    rules = [
        Predicate(destination_port_range=range_pb2.Int32Range(start=p, end=p + 1)) for p in ports
    ]
    return rules[0] if len(rules) == 1 else Predicate(or_match=Predicate.MatchSet(rules=rules))


def _http_inspector(shape: InboundShape) -> listener_components_pb2.ListenerFilter:
    """http_inspector, except on the workload's TCP ports: their chains do not ask what the
    bytes are, and a protocol whose server speaks first would wait for it."""
    inspector = _listener_filter(
        "envoy.filters.listener.http_inspector", http_inspector_pb2.HttpInspector()
    )
    tcp = [port for port, protocol in shape.ports if protocol is InboundProtocol.TCP]
    if tcp:
        inspector.filter_disabled.CopyFrom(_on_ports(tcp))
    return inspector


def virtual_inbound(
    shape: InboundShape, normalization: PathNormalization = PathNormalization.BASE
) -> listener_pb2.Listener:
    """15006: every captured inbound connection, by original destination port (HTTP paths
    normalized as `normalization` says)."""
    chains = [_blackhole_chain()]
    for port, protocol in shape.ports:
        chains += _port_chains(shape, port, protocol, normalization)
    for port, mode in shape.passthrough_ports:
        chains += _passthrough_chains(f"{VIRTUAL_INBOUND}|{port}", port, mode, shape.authz)
    chains += _passthrough_chains(VIRTUAL_INBOUND, None, shape.mode, shape.authz)
    if shape.authz:
        named = applied_names(shape.authz)
        for chain in chains[1:]:  # every chain but the blackhole runs RBAC filters
            chain.metadata.filter_metadata[METADATA_KEY].update({AUTHZ_METADATA: named})
    if shape.jwt:
        verified = [f"{o.namespace}/{o.name}" for o in shape.jwt.objects]
        for chain in chains[1:]:
            if any(
                f.name == "envoy.filters.network.http_connection_manager" for f in chain.filters
            ):
                chain.metadata.filter_metadata[METADATA_KEY].update({JWT_METADATA: verified})
    listener = listener_pb2.Listener(
        name=VIRTUAL_INBOUND,
        address=socket_address(ANY_ADDRESS, VIRTUAL_INBOUND_PORT),
        traffic_direction=base_pb2.INBOUND,
        listener_filters=[
            _listener_filter("envoy.filters.listener.original_dst", original_dst_pb2.OriginalDst()),
            _listener_filter(
                "envoy.filters.listener.tls_inspector", tls_inspector_pb2.TlsInspector()
            ),
            _http_inspector(shape),
        ],
        # A client that sends nothing first (a server-first protocol) is not cut off when
        # the inspectors give up waiting: it goes on to the chain for what is known.
        continue_on_listener_filters_timeout=True,
        filter_chains=chains,
    )
    return listener


def _original_dst(name: str) -> cluster_pb2.Cluster:
    """A cluster to the connection's original destination, from 127.0.0.6."""
    cluster = cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.ORIGINAL_DST,
        lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED,
        connect_timeout=duration_pb2.Duration(seconds=CONNECT_TIMEOUT_SECONDS),
    )
    cluster.upstream_bind_config.source_address.address = INBOUND_SOURCE_ADDRESS
    cluster.upstream_bind_config.source_address.port_value = 0
    return lift_circuit_breakers(cluster)  # as Istio's: the app gets what its clients send


def inbound_cluster(port: int, protocol: InboundProtocol) -> cluster_pb2.Cluster:
    """`inbound|P||`: the app on the pod, where the client was going."""
    cluster = _original_dst(inbound_cluster_name(port))
    if protocol in (InboundProtocol.HTTP2, InboundProtocol.GRPC):
        cluster.typed_extension_protocol_options[HTTP_OPTIONS_KEY].CopyFrom(http2_options())
    return cluster


def jwks_clusters(jwt: AppliedAuthentications) -> list[cluster_pb2.Cluster]:
    """The clusters Envoy fetches the workload's remote JWKS through."""
    return [jwks_cluster(uri) for uri in jwt.jwks_uris]


def inbound_passthrough_cluster() -> cluster_pb2.Cluster:
    """Where connections to ports no service names go: their original destination."""
    return _original_dst(INBOUND_PASSTHROUGH_CLUSTER)
