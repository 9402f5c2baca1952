"""`pilot agent` next to a real Envoy: SDS over a Unix socket, certificates from pilot's CA.

The agent authenticates to pilot's CA with its service-account token (pilot
checks it by TokenReview against the test API server); Envoy takes its
listener certificate and trust root from the agent's socket and presents a
certificate naming the pod's identity, chained to pilot's root.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from cryptography import x509

from pilot.agent import Agent, AgentSettings
from pilot.security.ca_client import RemoteCaSettings
from pilot.security.identity import Identity
from tests.harness.envoy_process import EnvoyProcess
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.mesh import simple_mesh
from tests.support.pilot import running_pilot

IDENTITY = Identity("cluster.local", "shop", "cart")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _typed(message: str, **config: Any) -> dict[str, Any]:
    return {"@type": f"type.googleapis.com/envoy.{message}", **config}


def _sds(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "sds_config": {
            "resource_api_version": "V3",
            "api_config_source": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
            },
        },
    }


def _bootstrap(sds_socket: Path, listener_port: int) -> dict[str, Any]:
    """A TLS listener whose certificate and root come from the agent's socket (Istio's shape)."""
    tls = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": _typed(
            "extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            common_tls_context={
                "tls_certificate_sds_secret_configs": [_sds("default")],
                "validation_context_sds_secret_config": _sds("ROOTCA"),
            },
        ),
    }
    direct = {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": _typed(
            "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            stat_prefix="inbound",
            http_filters=[
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": _typed("extensions.filters.http.router.v3.Router"),
                }
            ],
            route_config={
                "virtual_hosts": [
                    {
                        "name": "all",
                        "domains": ["*"],
                        "routes": [
                            {
                                "match": {"prefix": "/"},
                                "direct_response": {
                                    "status": 200,
                                    "body": {"inline_string": "hello"},
                                },
                            }
                        ],
                    }
                ]
            },
        ),
    }
    return {
        "node": {
            "id": "sidecar~127.0.0.1~cart.shop~shop.svc.cluster.local",
            "cluster": "cart.shop",
        },
        "static_resources": {
            "listeners": [
                {
                    "name": "inbound",
                    "address": {
                        "socket_address": {"address": "127.0.0.1", "port_value": listener_port}
                    },
                    "filter_chains": [{"filters": [direct], "transport_socket": tls}],
                }
            ],
            "clusters": [
                {
                    "name": "sds-grpc",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _typed(
                            "extensions.upstreams.http.v3.HttpProtocolOptions",
                            explicit_http_config={"http2_protocol_options": {}},
                        )
                    },
                    "load_assignment": {
                        "cluster_name": "sds-grpc",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {"endpoint": {"address": {"pipe": {"path": str(sds_socket)}}}}
                                ]
                            }
                        ],
                    },
                }
            ],
        },
    }


@asynccontextmanager
async def _agent(settings: AgentSettings) -> AsyncIterator[Agent]:
    agent = Agent(settings)
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


def _served_certificate(port: int, root_pem: str) -> x509.Certificate:
    """Connect with TLS, verifying the chain against pilot's root (no hostname: SPIFFE)."""
    context = ssl.create_default_context(cadata=root_pem)
    context.check_hostname = False
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _uris(certificate: x509.Certificate) -> list[str]:
    san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.UniformResourceIdentifier)


async def test_envoy_gets_its_certificate_from_the_agent(tmp_path: Path) -> None:
    async with KubeAPIServer() as api:
        token_file = tmp_path / "istio-token"
        token_file.write_text(api.add_service_account_token("shop", "cart"))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        async with running_pilot(
            tmp_path, simple_mesh({"a": ["127.0.0.1"]}), kubeconfig=kubeconfig
        ) as pilot:
            sds_socket = tmp_path / "var/run/secrets/workload-spiffe-uds/socket"
            remote = RemoteCaSettings(
                address=pilot.grpc_target,
                insecure=True,
                token_file=token_file,
                own_identity=IDENTITY,
            )
            port = _free_port()
            async with (
                _agent(AgentSettings(sds_socket, IDENTITY, remote)) as agent,
                EnvoyProcess(
                    _bootstrap(sds_socket, port), tmp_path / "envoy", "agent-envoy"
                ) as envoy,
            ):
                assert oct(sds_socket.stat().st_mode & 0o777) == "0o600"
                await envoy.wait_live()
                await envoy.wait_for(
                    envoy.certs,
                    10,
                    "Envoy to hold the agent's certificate",
                    until=lambda certs: IDENTITY.uri in str(certs),
                )
                root = pilot.discovery.security.ca.root_pem
                served = await asyncio.to_thread(_served_certificate, port, root)
                assert _uris(served) == [IDENTITY.uri]
                assert agent.secrets.stats.minted == 1
                reviewed = [r.username for r in api.token_reviews if r.authenticated]
                assert reviewed == ["system:serviceaccount:shop:cart"]
                certs = await envoy.certs()
                assert IDENTITY.uri in str(certs)
