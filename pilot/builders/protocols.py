"""Protocol selection: what a Service port speaks, from its appProtocol or its name, as Istio.

Istio's rules (no protocol sniffing): a port's `appProtocol`, when set, is what
is parsed, else its name; `grpc-web...` is gRPC-Web, otherwise the part before
the first `-` names the protocol, case-insensitive (`http`, `http-web`,
`grpc`, `tcp-db`, ...). Kubernetes' own `kubernetes.io/h2c` is HTTP/2 and
`kubernetes.io/ws` is HTTP. Anything else (no name, `web`, `kubernetes.io/wss`)
is plain TCP, as in Istio with sniffing off. A UDP or SCTP port is none of
these: pilot builds no cluster or listener for it.
"""

from __future__ import annotations

from enum import StrEnum

from pilot.registry.model import ServicePort


class PortProtocol(StrEnum):
    """The protocols Istio tells apart on a Service port."""

    HTTP = "HTTP"
    HTTP2 = "HTTP2"
    GRPC = "GRPC"
    GRPC_WEB = "GRPC-Web"
    HTTPS = "HTTPS"
    TLS = "TLS"
    TCP = "TCP"
    MONGO = "Mongo"
    REDIS = "Redis"
    MYSQL = "MySQL"
    UDP = "UDP"


_BY_NAME = {p.value.lower(): p for p in PortProtocol if p is not PortProtocol.GRPC_WEB}
_KUBERNETES_APP_PROTOCOLS = {
    "kubernetes.io/h2c": PortProtocol.HTTP2,
    "kubernetes.io/ws": PortProtocol.HTTP,
}
_HTTP = frozenset({PortProtocol.HTTP, PortProtocol.HTTP2, PortProtocol.GRPC, PortProtocol.GRPC_WEB})
_GRPC_WEB = "grpc-web"


def protocol_of(port: ServicePort) -> PortProtocol:
    """What `port` speaks, by Istio's protocol selection."""
    if port.protocol.upper() != "TCP":
        return PortProtocol.UDP  # UDP and SCTP: nothing pilot builds carries them
    name = port.app_protocol or port.name
    known = _KUBERNETES_APP_PROTOCOLS.get(name)
    if known is not None:
        return known
    if name[: len(_GRPC_WEB)].lower() == _GRPC_WEB:
        return PortProtocol.GRPC_WEB
    prefix = name.partition("-")[0].lower()
    found = _BY_NAME.get(prefix, PortProtocol.TCP)
    return PortProtocol.TCP if found is PortProtocol.UDP else found


def is_http(port: ServicePort) -> bool:
    """Whether Envoy routes this port's traffic as HTTP (a route configuration per port)."""
    return protocol_of(port) in _HTTP
