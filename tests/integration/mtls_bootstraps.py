"""Envoy bootstraps for the mTLS tests: a server Envoy and a client Envoy.

Owns the *server* bootstrap (a static listener terminating mTLS with `default`
and `ROOTCA` over ADS, in front of a local HTTP backend) and the *client*
bootstrap (a plain-HTTP listener in front of a static cluster speaking mTLS
with secrets from pilot's SecretDiscoveryService, since Envoy 1.40 cannot start
with a static cluster on ADS SDS), and the listener and cluster names they use.
"""

from __future__ import annotations

from typing import Any

from tests.support.envoy_process import Json, load_example_bootstrap
from tests.support.proxies import Proxy
from tests.support.sds_secrets import ROOT, WORKLOAD

ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}
HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)
TLS_SOCKET = "envoy.transport_sockets.tls"
HTTP_OPTIONS_TYPE = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
TLS_TYPES = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."


def ads_sds() -> Json:
    """Secrets over the ADS stream: what listeners (and dynamic clusters) use."""
    return {"ads": {}, "resource_api_version": "V3"}


def grpc_sds(delta: bool = False) -> Json:
    """Secrets from pilot's SecretDiscoveryService on the xds-grpc cluster (static clusters)."""
    return {
        "api_config_source": {
            "api_type": "DELTA_GRPC" if delta else "GRPC",
            "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}],
        },
        "resource_api_version": "V3",
    }


def _tls_context(sds_config: Json, peer_san: str | None) -> Json:
    validation: Json = {"name": ROOT, "sds_config": sds_config}
    context: Json = {
        "tls_certificate_sds_secret_configs": [{"name": WORKLOAD, "sds_config": sds_config}]
    }
    if peer_san is None:
        context["validation_context_sds_secret_config"] = validation
    else:
        match = {"san_type": "URI", "matcher": {"exact": peer_san}}
        context["combined_validation_context"] = {
            "default_validation_context": {"match_typed_subject_alt_names": [match]},
            "validation_context_sds_secret_config": validation,
        }
    return context


def _static_cluster(name: str, port: int, **extra: Any) -> Json:
    endpoint = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
        },
        **extra,
    }


def _http_listener(name: str, cluster: str, **hcm_extra: Any) -> Json:
    hcm = {
        "@type": HCM_TYPE,
        "stat_prefix": name.replace("-", "_"),
        "route_config": {
            "name": f"{name}-routes",
            "virtual_hosts": [
                {
                    "name": cluster,
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}],
                }
            ],
        },
        "http_filters": [ROUTER],
        **hcm_extra,
    }
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                ]
            }
        ],
    }


MTLS_LISTENER = "mtls-in"
BACKEND_CLUSTER = "backend"
PLAIN_LISTENER = "http-out"
SERVER_CLUSTER = "shop-server"


def server_bootstrap(xds_port: int, proxy: Proxy, *, backend_port: int, example: str) -> Json:
    """An Envoy that terminates mTLS (`default` and `ROOTCA` over ADS) in front of a backend.

    The listener requires a client certificate chained to pilot's root and tells the
    backend who called in `x-forwarded-client-cert` (URI SAN and certificate hash).
    """
    bootstrap = load_example_bootstrap(example, xds_port, proxy.node_id, proxy.metadata)
    listener = _http_listener(
        MTLS_LISTENER,
        BACKEND_CLUSTER,
        forward_client_cert_details="SANITIZE_SET",
        set_current_client_cert_details={"uri": True},
    )
    listener["filter_chains"][0]["transport_socket"] = {
        "name": TLS_SOCKET,
        "typed_config": {
            "@type": TLS_TYPES + "DownstreamTlsContext",
            "require_client_certificate": True,
            "common_tls_context": _tls_context(ads_sds(), None),
        },
    }
    static = bootstrap["static_resources"]
    static["listeners"] = [listener]
    static["clusters"].append(_static_cluster(BACKEND_CLUSTER, backend_port))
    return bootstrap


def client_bootstrap(
    xds_port: int,
    proxy: Proxy,
    *,
    server_port: int,
    server_san: str,
    example: str,
    sds_delta: bool = False,
) -> Json:
    """An Envoy whose plain-HTTP listener routes to a static cluster speaking mTLS.

    The cluster takes `default` and `ROOTCA` from pilot's SecretDiscoveryService, checks
    the server's URI SAN, and opens a new connection (a new handshake) per request.
    """
    bootstrap = load_example_bootstrap(example, xds_port, proxy.node_id, proxy.metadata)
    cluster = _static_cluster(
        SERVER_CLUSTER,
        server_port,
        transport_socket={
            "name": TLS_SOCKET,
            "typed_config": {
                "@type": TLS_TYPES + "UpstreamTlsContext",
                "common_tls_context": _tls_context(grpc_sds(sds_delta), server_san),
            },
        },
        typed_extension_protocol_options={
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS_TYPE,
                "common_http_protocol_options": {"max_requests_per_connection": 1},
                "explicit_http_config": {"http_protocol_options": {}},
            }
        },
    )
    static = bootstrap["static_resources"]
    static["listeners"] = [_http_listener(PLAIN_LISTENER, SERVER_CLUSTER)]
    static["clusters"].append(cluster)
    return bootstrap
