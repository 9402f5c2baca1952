"""Real Envoys speak mTLS with certificates from their own `pilot agent`, as in Istio.

The same pair as test_sds_mtls (a *server* Envoy, ns `shop` sa `server`, terminating
mTLS in front of a local HTTP backend; a *client* Envoy, ns `web` sa `client`, routing
plain HTTP to a static cluster that speaks mTLS to it and accepts only the server's
SPIFFE identity), built by the same bootstrap builders (mtls_bootstraps). Only the source of the
secrets differs: each Envoy has no ADS and takes `default` and `ROOTCA` from a static
`sds-grpc` cluster whose one endpoint is the Unix socket of its own agent. Each agent is
the README's `pilot agent` command run as a subprocess (agent_process) with its pod's
identity, talking TLS to pilot's TLS port verified with pilot's root; it authenticates
to pilot's CA with its service account's token (pilot checks it by TokenReview against
the test API server) and mints one certificate for its identity. What an agent serves
is read from its socket, as its Envoy (same node id) reads it.

pilot runs in process (tests.support.pilot): the tests read its root and its counters.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.agent_process import (
    CA_ERROR,
    MINTED,
    AgentProcess,
    agent_folder,
    readme_command,
    running_agent,
)
from tests.integration.envoy_tls_view import (
    STARTUP,
    assert_envoy_holds,
    listener_port,
    listener_ssl_stat,
    wait_for_own_cert,
)
from tests.integration.http_backend import BACKEND_BODY, Backend
from tests.integration.mtls_bootstraps import (
    MTLS_LISTENER,
    PLAIN_LISTENER,
    SERVER_CLUSTER,
    client_bootstrap,
    server_bootstrap,
)
from tests.integration.mtls_pair import (
    CLIENT,
    MESH_SERVICES,
    SERVER,
    MtlsPair,
    assert_client_cluster_verified,
)
from tests.integration.tls_probe import tls_get
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.envoy_process import XDS_CLUSTER, EnvoyProcess, Json
from tests.support.mesh import simple_mesh
from tests.support.pilot import RunningPilot, running_pilot
from tests.support.proxies import Proxy
from tests.support.sds_secrets import ROOT, WORKLOAD, WorkloadCert, root_in, workload_in
from tests.support.xds_client import SECRET, XdsClient

SDS_CLUSTER = "sds-grpc"
AGENT_SDS: Json = {
    "api_config_source": {
        "api_type": "GRPC",
        "transport_api_version": "V3",
        "grpc_services": [{"envoy_grpc": {"cluster_name": SDS_CLUSTER}}],
    },
    "resource_api_version": "V3",
}


def _through_agent(bootstrap: Json, sds_socket: Path) -> Json:
    """The same Envoy with no ADS, its secrets from the agent on `sds_socket` instead.

    The example's `xds-grpc` cluster (HTTP/2 to pilot) becomes `sds-grpc`, HTTP/2 to a
    `pipe` address; every `sds_config` (the listener's or cluster's `default` and
    `ROOTCA`) points at it; `dynamic_resources` go, so nothing reaches pilot directly.
    """
    bootstrap = copy.deepcopy(bootstrap)
    del bootstrap["dynamic_resources"]
    static = bootstrap["static_resources"]
    [sds] = [cluster for cluster in static["clusters"] if cluster["name"] == XDS_CLUSTER]
    sds["name"] = sds["load_assignment"]["cluster_name"] = SDS_CLUSTER
    pipe = {"address": {"pipe": {"path": str(sds_socket)}}}
    sds["load_assignment"]["endpoints"] = [{"lb_endpoints": [{"endpoint": pipe}]}]
    replaced = _point_sds_at_agent(static)
    assert replaced == 2, f"expected the default and ROOTCA sds_configs, replaced {replaced}"
    return bootstrap


def _point_sds_at_agent(node: Any) -> int:
    """Replace every `sds_config` under `node` by AGENT_SDS; return how many."""
    count = 0
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "sds_config":
                node[key] = copy.deepcopy(AGENT_SDS)
                count += 1
            else:
                count += _point_sds_at_agent(value)
    elif isinstance(node, list):
        count += sum(_point_sds_at_agent(item) for item in node)
    return count


@dataclass
class AgentPair:
    """The mTLS pair and the agent of each Envoy."""

    pair: MtlsPair
    server_agent: AgentProcess
    client_agent: AgentProcess


@asynccontextmanager
async def _agent(pilot: RunningPilot, proxy: Proxy, token: str) -> AsyncIterator[AgentProcess]:
    """The README's agent with `proxy`'s identity and token, pilot's TLS port as its CA."""
    async with agent_folder() as folder:
        folder.write_token(readme_command(), token)
        security = pilot.discovery.security
        assert security is not None
        folder.write_root(security.ca.root_pem)
        identity = {"POD_NAMESPACE": proxy.namespace, "SERVICE_ACCOUNT": proxy.account}
        address = f"localhost:{pilot.discovery.grpc.tls_port}"
        async with running_agent(folder, address, identity) as agent:
            yield agent


@asynccontextmanager
async def agent_mtls_pair(
    pilot: RunningPilot, api: KubeAPIServer, workdir: Path
) -> AsyncIterator[AgentPair]:
    """Backend, server agent and Envoy, then client agent and Envoy; return once both serve.

    Ready means what mtls_pair.mtls_pair means: each Envoy's /certs shows its own
    identity, both are LIVE, both listeners are bound, and the client's cluster has taken
    both secrets over SDS.
    """
    async with AsyncExitStack() as stack:
        backend = await stack.enter_async_context(Backend())
        server_token = api.add_service_account_token(SERVER.namespace, SERVER.account)
        server_agent = await stack.enter_async_context(_agent(pilot, SERVER, server_token))
        server_boot = server_bootstrap(
            pilot.grpc_port, SERVER, backend_port=backend.port, example="envoy-ads-delta.yaml"
        )
        server = await stack.enter_async_context(
            EnvoyProcess(
                _through_agent(server_boot, server_agent.folder.socket),
                workdir / "server",
                "server",
            )
        )
        await wait_for_own_cert(server, SERVER.uri)
        await server.wait_live(STARTUP)
        mtls_port = await server.wait_for(
            lambda: listener_port(server, MTLS_LISTENER), STARTUP, "the mTLS listener"
        )

        client_token = api.add_service_account_token(CLIENT.namespace, CLIENT.account)
        client_agent = await stack.enter_async_context(_agent(pilot, CLIENT, client_token))
        client_boot = client_bootstrap(
            pilot.grpc_port,
            CLIENT,
            server_port=mtls_port,
            server_san=SERVER.uri,
            example="envoy-ads-sotw.yaml",
        )
        client = await stack.enter_async_context(
            EnvoyProcess(
                _through_agent(client_boot, client_agent.folder.socket),
                workdir / "client",
                "client",
            )
        )
        await wait_for_own_cert(client, CLIENT.uri)
        await client.wait_live(STARTUP)
        http_port = await client.wait_for(
            lambda: listener_port(client, PLAIN_LISTENER), STARTUP, "the HTTP listener"
        )
        await client.wait_for_stat(
            f"cluster.{SERVER_CLUSTER}.client_ssl_socket_factory.ssl_context_update_by_sds",
            lambda value: isinstance(value, int) and value >= 2,
            STARTUP,
        )
        pair = MtlsPair(server, client, backend, mtls_port, http_port)
        yield AgentPair(pair, server_agent, client_agent)


async def _served_by(agent: AgentProcess, proxy: Proxy) -> tuple[WorkloadCert, str]:
    """`default` and `ROOTCA` as the agent serves them to `proxy`'s node (its Envoy's)."""
    async with XdsClient(f"unix:{agent.folder.socket}") as xds:
        sds = xds.sds(proxy.node())
        await sds.subscribe(SECRET, [WORKLOAD, ROOT])
        arrived = await sds.ack_until(SECRET, [WORKLOAD, ROOT], 10)
    return workload_in(arrived), root_in(arrived)


async def _assert_holds_agent_identity(
    envoy: EnvoyProcess, agent: AgentProcess, pilot: RunningPilot, proxy: Proxy
) -> str:
    """/certs shows exactly what the agent serves, under pilot's root; return its leaf hash."""
    security = pilot.discovery.security
    assert security is not None
    served, root = await _served_by(agent, proxy)
    assert served.uris == (proxy.uri,)
    assert served.key_matches_leaf
    assert served.signed_by(security.ca.root_pem), "the agent's chain does not end at pilot's root"
    assert root == security.ca.root_pem, "the agent's ROOTCA is not pilot's root"
    await assert_envoy_holds(envoy, served.serial, proxy.uri, security.ca.root.serial_number)
    return served.leaf_sha256


async def test_request_crosses_mtls_between_envoys_of_two_agents(tmp_path: Path) -> None:
    async with KubeAPIServer() as api:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        async with (
            running_pilot(
                tmp_path,
                simple_mesh(MESH_SERVICES),
                kubeconfig=kubeconfig,
                grpc_tls_addr="127.0.0.1:0",
            ) as pilot,
            agent_mtls_pair(pilot, api, tmp_path) as agents,
        ):
            pair = agents.pair
            await _assert_holds_agent_identity(pair.server, agents.server_agent, pilot, SERVER)
            client_hash = await _assert_holds_agent_identity(
                pair.client, agents.client_agent, pilot, CLIENT
            )

            status, body = await pair.get("/orders/17")

            assert (status, body) == (200, f"{BACKEND_BODY} /orders/17")
            assert [seen.path for seen in pair.backend.seen] == ["/orders/17"]
            # The server Envoy saw the client's certificate, the one its agent minted.
            seen = pair.backend.seen[0]
            assert seen.xfcc_field("URI") == CLIENT.uri
            assert seen.xfcc_field("By") == SERVER.uri
            assert seen.xfcc_field("Hash") == client_hash
            await assert_client_cluster_verified(pair)

            # A TLS client with no certificate is refused and reaches nothing.
            security = pilot.discovery.security
            assert security is not None
            no_cert = await tls_get(pair.mtls_port, security.ca.root_pem, tmp_path)
            assert no_cert.status_line is None, f"no client certificate, yet: {no_cert}"
            await pair.server.wait_for(
                lambda: listener_ssl_stat(pair.server, "fail_verify_no_cert"),
                10,
                "the listener to count a handshake without a client certificate",
                until=lambda count: count == 1,
            )
            assert [seen.path for seen in pair.backend.seen] == ["/orders/17"]

            # Each agent minted once, through pilot's CA, with its own service account's
            # token; pilot itself minted nothing (no Envoy asked it for secrets).
            for agent in (agents.server_agent, agents.client_agent):
                minted = await agent.count_once_logged(MINTED)
                assert (minted, agent.count(CA_ERROR)) == (1, 0), agent.tail()
            assert security.secrets.stats.minted == 0
            reviews = sorted((r.username, r.authenticated) for r in api.token_reviews)
            assert reviews == [
                ("system:serviceaccount:shop:server", True),
                ("system:serviceaccount:web:client", True),
            ]
