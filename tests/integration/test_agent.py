"""`pilot agent` as users run it, next to a real Envoy: SDS on a Unix socket, CSRs to pilot.

Every agent here is the README's command run as a subprocess (agent_process), in a
folder of its own under umask 000, with the token and CA root where the command and
the agent's defaults say. By default it talks TLS to pilot's TLS port, verified with
that root, and presents its service-account token, which pilot checks by TokenReview
against the test API server; Envoy takes its listener certificate and trust root from
the agent's socket and presents a certificate naming the pod's identity, chained to
pilot's root. The root is the configured one, never one a CA hands back: a pilot the
root does not verify never sees the token, and a chain that does not lead to the root
is refused even over plaintext (`CA_INSECURE=true`). Start-up refuses, in one line, a
missing root file and a socket directory that others could write (in a shared one, an
emptyDir, the agent's socket goes into a private directory of its own inside).

pilot runs in process (tests.support.pilot): the tests read its root and ports.
"""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from pilot.agent.sds_agent import DEFAULT_ROOT_CERT, DEFAULT_SOCKET
from pilot.security.certs import cert_pem, self_signed_root
from pilot.security.identity import Identity
from tests.integration.agent_process import (
    CA_ERROR,
    MINTED,
    AgentFolder,
    AgentProcess,
    agent_folder,
    readme_command,
    run_to_exit,
    running_agent,
)
from tests.integration.envoy_tls_view import ca_certs, listener_port
from tests.integration.tls_probe import served_certificate
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.envoy_process import EnvoyProcess
from tests.support.mesh import simple_mesh
from tests.support.pilot import RunningPilot, running_pilot
from tests.support.sds_secrets import ROOT, WORKLOAD, root_in, workload_in, workloads_received
from tests.support.xds_client import SECRET, SotwStream, XdsClient, node

COMMAND = readme_command()
IDENTITY = Identity("cluster.local", COMMAND.env["POD_NAMESPACE"], COMMAND.env["SERVICE_ACCOUNT"])
NODE_ID = "sidecar~127.0.0.1~cart.shop~shop.svc.cluster.local"


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


def _bootstrap(sds_socket: Path) -> dict[str, Any]:
    """A TLS listener whose certificate and root come from the agent's socket (Istio's shape).

    The listener binds a port of its own choosing (0); `listener_port` reads it back.
    """
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
            "id": NODE_ID,
            "cluster": "cart.shop",
        },
        "static_resources": {
            "listeners": [
                {
                    "name": "inbound",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
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


def _uris(certificate: x509.Certificate) -> list[str]:
    san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.UniformResourceIdentifier)


@dataclass
class Mesh:
    """The test API server (TokenReview), a pilot with a TLS port, and the agent's token."""

    api: KubeAPIServer
    pilot: RunningPilot
    token: str

    @property
    def root_pem(self) -> str:
        security = self.pilot.discovery.security
        assert security is not None
        return security.ca.root_pem

    @property
    def tls_address(self) -> str:
        return f"localhost:{self.pilot.discovery.grpc.tls_port}"  # pilot's certificate names it

    @property
    def plaintext_address(self) -> str:
        return self.pilot.grpc_target

    def prepare(self, folder: AgentFolder, root_pem: str | None = None) -> None:
        """The token and the CA root (pilot's unless told) where the agent looks for them."""
        folder.write_token(COMMAND, self.token)
        folder.write_root(self.root_pem if root_pem is None else root_pem)

    def reviewed(self) -> list[str]:
        return [r.username or "" for r in self.api.token_reviews if r.authenticated]


@asynccontextmanager
async def _mesh(tmp_path: Path) -> AsyncIterator[Mesh]:
    async with KubeAPIServer() as api:
        token = api.add_service_account_token(IDENTITY.namespace, IDENTITY.service_account)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        async with running_pilot(
            tmp_path,
            simple_mesh({"a": ["127.0.0.1"]}),
            kubeconfig=kubeconfig,
            grpc_tls_addr="127.0.0.1:0",
        ) as pilot:
            yield Mesh(api, pilot, token)


def _other_root() -> str:
    return cert_pem(self_signed_root("cluster.local")[1])


def _mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


@asynccontextmanager
async def _asking(agent: AgentProcess) -> AsyncIterator[SotwStream]:
    """A stream on the agent's socket asking for `default` and `ROOTCA`, as Envoy would.

    The agent mints only while some stream asks: keep it open while waiting for logs.
    """
    async with XdsClient(f"unix:{agent.folder.socket}") as xds:
        sds = xds.sds(node(NODE_ID))
        await sds.subscribe(SECRET, [WORKLOAD, ROOT])
        yield sds


async def _root_and_no_workload(agent: AgentProcess, sds: SotwStream) -> str:
    """ROOTCA as served, once the agent failed twice to get a certificate; none served."""
    root = root_in(await sds.ack_until(SECRET, [ROOT], 10))
    await agent.wait_count(CA_ERROR, 2)
    await sds.ack_pending()
    assert workloads_received(sds) == [], "a `default` was served"
    assert agent.count(MINTED) == 0
    return root


async def test_envoy_gets_its_certificate_from_the_agent(tmp_path: Path) -> None:
    async with _mesh(tmp_path) as mesh, agent_folder() as folder:
        mesh.prepare(folder)
        async with (
            running_agent(folder, mesh.tls_address) as agent,
            EnvoyProcess(_bootstrap(folder.socket), tmp_path / "envoy", "agent-envoy") as envoy,
        ):
            # Under umask 000: the socket is the agent's user's alone, in a private directory.
            assert _mode(folder.socket) == "0o600"
            assert _mode(folder.socket.parent) == "0o700"
            assert _mode(folder.path / "var/run/secrets") == "0o755"
            assert any("CA at " + mesh.tls_address + " (TLS" in line for line in agent.lines)
            await envoy.wait_live()
            await envoy.wait_for(
                envoy.certs,
                10,
                "Envoy to hold the agent's certificate",
                until=lambda certs: IDENTITY.uri in str(certs),
            )
            port = await listener_port(envoy, "inbound")
            served = await served_certificate(port, mesh.root_pem)
            assert _uris(served) == [IDENTITY.uri]
            pilot_root = x509.load_pem_x509_certificate(mesh.root_pem.encode())
            assert {c.serial for c in await ca_certs(envoy)} == {pilot_root.serial_number}
            assert await agent.count_once_logged(MINTED) == 1
            assert agent.count(CA_ERROR) == 0
            assert mesh.reviewed() == [
                f"system:serviceaccount:{IDENTITY.account.replace('/', ':')}"
            ]


async def test_the_agent_never_sends_its_token_to_a_pilot_its_root_does_not_verify(
    tmp_path: Path,
) -> None:
    async with _mesh(tmp_path) as mesh, agent_folder() as folder:
        configured = _other_root()
        mesh.prepare(folder, root_pem=configured)
        async with running_agent(folder, mesh.tls_address) as agent, _asking(agent) as sds:
            assert await _root_and_no_workload(agent, sds) == configured
        assert mesh.api.token_reviews == [], "the token reached a server the root did not verify"


async def test_plaintext_only_with_ca_insecure(tmp_path: Path) -> None:
    async with _mesh(tmp_path) as mesh:
        async with agent_folder() as folder:
            mesh.prepare(folder)
            # TLS by default, and pilot's 15010 is plaintext: no handshake, no certificate.
            async with (
                running_agent(folder, mesh.plaintext_address) as agent,
                _asking(agent) as sds,
            ):
                await _root_and_no_workload(agent, sds)
        assert mesh.api.token_reviews == []
        async with agent_folder() as folder:
            mesh.prepare(folder)
            env = {"CA_INSECURE": "true"}
            async with (
                running_agent(folder, mesh.plaintext_address, env) as agent,
                _asking(agent) as sds,
            ):
                assert any("in plaintext" in line for line in agent.lines)
                arrived = await sds.ack_until(SECRET, [WORKLOAD, ROOT], 10)
                assert root_in(arrived) == mesh.root_pem
                assert workload_in(arrived).uris == (IDENTITY.uri,)
                assert await agent.count_once_logged(MINTED) == 1
        assert len(mesh.reviewed()) == 1


async def test_no_root_is_learned_from_the_ca_even_in_plaintext(tmp_path: Path) -> None:
    """pilot signs, but under a root that is not the configured one: nothing is served but
    the configured ROOTCA, and the agent says why."""
    async with _mesh(tmp_path) as mesh, agent_folder() as folder:
        configured = _other_root()
        mesh.prepare(folder, root_pem=configured)
        env = {"CA_INSECURE": "true"}
        async with (
            running_agent(folder, mesh.plaintext_address, env) as agent,
            _asking(agent) as sds,
        ):
            assert await _root_and_no_workload(agent, sds) == configured
            errors = [line for line in agent.lines if CA_ERROR in line]
            assert all("does not verify" in line for line in errors), errors
        assert mesh.reviewed(), "pilot was asked, and signed: the agent refused the chain"


async def test_a_missing_root_is_a_one_line_error_naming_it() -> None:
    async with agent_folder() as folder:
        folder.write_token(COMMAND, "token")
        status, stderr = await run_to_exit(folder, "localhost:1")
    root = folder.path / DEFAULT_ROOT_CERT
    assert status == 2
    assert stderr.splitlines() == [
        f"pilot: error: CA_ROOT_CERT: cannot read the CA root {root}: No such file or directory"
    ]


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702], ids=oct)
async def test_a_socket_directory_others_can_write_is_refused(mode: int) -> None:
    """In a shared directory (an emptyDir) the agent serves from `agent`, its own: one
    that others can write (someone made it first) is refused."""
    async with agent_folder() as folder:
        folder.write_token(COMMAND, "token")
        folder.write_root(_other_root())
        shared = folder.path / DEFAULT_SOCKET.parent
        shared.mkdir(parents=True)
        shared.chmod(0o777)
        (shared / "agent").mkdir()
        (shared / "agent").chmod(mode)
        status, stderr = await run_to_exit(folder, "localhost:1")
        assert not folder.socket.exists()
        assert not (shared / "agent" / "socket").exists()
    assert status == 2
    [line] = stderr.splitlines()
    assert line.startswith(
        f"pilot: error: SDS socket directory {DEFAULT_SOCKET.parent / 'agent'} is writable"
    )
    assert f"(mode {mode:04o})" in line


async def test_the_trust_domain_is_trust_domain_as_the_injector_sets_it() -> None:
    """Istio's agent reads TRUST_DOMAIN; a value that is not a DNS name is one line."""
    async with agent_folder() as folder:
        folder.write_token(COMMAND, "token")
        folder.write_root(_other_root())
        async with running_agent(folder, "localhost:1", {"TRUST_DOMAIN": "example.org"}) as agent:
            assert any(" for spiffe://example.org/ns/" in line for line in agent.lines)
        status, stderr = await run_to_exit(folder, "localhost:1", {"TRUST_DOMAIN": "Evil\nx"})
    assert status == 2
    [line] = stderr.splitlines()
    assert line.startswith("pilot: error: TRUST_DOMAIN: trust domain 'Evil\\nx' is not a valid")
