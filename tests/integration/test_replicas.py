"""Two pilot replicas against one API server: Envoys fail over and traffic never stops.

Replicas are stateless: each watches the (test) Kubernetes API server itself, and all
sign under the one root kept in Secret `pilot-ca-secret`. Two real Envoys list both
replicas in their bootstrap (`xds-grpc` has one priority level per replica, with gRPC
health checks; see `replica_support.list_pilots`) and prefer different ones:

* a *server* Envoy (delta ADS, its secrets over ADS, prefers replica a) terminates mTLS
  in front of a local backend, which it reaches through the cluster pilot gives it for
  service `shop` (so its traffic needs the endpoints pilot delivered);
* a *client* Envoy (SotW ADS plus SecretDiscoveryService streams for its static mTLS
  cluster, prefers replica b) sends the plain HTTP it receives to the server Envoy over
  mTLS, checking the server's SPIFFE identity.

Requests cross from the Envoy of one replica to the Envoy of the other: one root. Then
the replica one of the Envoys is connected to stops (a graceful drain) while requests keep
flowing: that Envoy moves all its streams to the survivor and takes a certificate from
it, never lacks a valid certificate nor an endpoint that exists, not one request fails,
and it follows the next endpoint change the survivor pushes; the other Envoy's streams
are not disturbed. (Replicas started at the same moment still share one root, one
holding the Lease: tests/cluster/test_shared_root_replicas.py, on a real API server.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pilot.security.component import Security
from pilot.security.identity import Identity
from tests.integration.envoy_tls_view import (
    STARTUP,
    ca_certs,
    listener_port,
    own_certs,
    wait_for_own_cert,
)
from tests.integration.http_backend import BACKEND_BODY, Backend
from tests.integration.mtls_bootstraps import (
    BACKEND_CLUSTER,
    MTLS_LISTENER,
    PLAIN_LISTENER,
    SERVER_CLUSTER,
    client_bootstrap,
    server_bootstrap,
)
from tests.integration.mtls_pair import CLIENT, SERVER
from tests.integration.replica_support import (
    CertMonitor,
    PortMesh,
    Svc,
    Traffic,
    drop_static_cluster,
    list_pilots,
    proxies_on,
    reroute,
)
from tests.integration.tls_probe import probe_credentials, tls_get
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.envoy_process import EnvoyProcess, wait_until
from tests.support.mesh import cluster_name
from tests.support.pilot import RunningPilot, running_kube_pilot
from tests.support.proxies import Proxy
from tests.support.sds_secrets import served_workload

CATALOG = ("127.0.1.1", "127.0.1.2")
PROBE = Identity("cluster.local", "web", "probe")
# Envoy's xDS connection gauges: ADS (`control_plane.`) and each SDS stream (`sds.<name>.`).
CONNECTED = r"^(sds\.[^.]+\.)?control_plane\.connected_state$"
# Requests that must still succeed once the moved Envoy follows the survivor's pushes.
AFTER_FAILOVER = 10


def security_of(pilot: RunningPilot) -> Security:
    security = pilot.discovery.security
    assert security is not None
    return security


def streams_of(pilot: RunningPilot, proxy: Proxy) -> set[int]:
    """Ids of the xDS streams `proxy` holds to `pilot`."""
    return {c.id for c in pilot.discovery.connections if c.proxy_id == proxy.node_id}


def kubeconfig_for(srv: KubeAPIServer, workdir: Path) -> Path:
    """Each replica gets its own directory (so its own local CA state) and kubeconfig."""
    workdir.mkdir()
    return write_kubeconfig(workdir / "kubeconfig", srv.url)


async def connection_gauges(envoy: EnvoyProcess) -> dict[str, object]:
    return dict(await envoy.stats(regex=CONNECTED))


async def shown_and_served(
    envoy: EnvoyProcess, pilot: RunningPilot, proxy: Proxy
) -> tuple[set[int], int | None]:
    """(serials of the certificates for `proxy` in Envoy's /certs, serial pilot serves it)."""
    served = served_workload(security_of(pilot).secrets, proxy)
    shown = {cert.serial for cert in await own_certs(envoy) if proxy.uri in cert.uris}
    return shown, served.serial if served else None


async def holds_cert_from(envoy: EnvoyProcess, pilot: RunningPilot, proxy: Proxy) -> int:
    """Wait until Envoy holds exactly the certificate `pilot` serves `proxy`; its serial."""
    _, served = await envoy.wait_for(
        lambda: shown_and_served(envoy, pilot, proxy),
        STARTUP,
        f"/certs to show the certificate {proxy.node_id} gets from its replica",
        until=lambda pair: pair[1] is not None and pair[0] == {pair[1]},
    )
    assert served is not None
    return served


@dataclass
class Scene:
    """The API server, the backend, both replicas and both Envoys, ready for traffic."""

    srv: KubeAPIServer
    backend: Backend
    mesh: PortMesh
    replicas: dict[str, RunningPilot]
    stacks: dict[str, AsyncExitStack]  # one per replica, so that a test can stop one
    server: EnvoyProcess
    client: EnvoyProcess
    mtls_port: int
    url: str

    @property
    def root_pem(self) -> str:
        return security_of(self.replicas["a"]).ca.root_pem

    @property
    def root_serial(self) -> int:
        return security_of(self.replicas["a"]).ca.root.serial_number


async def start_server_envoy(
    stack: AsyncExitStack, workdir: Path, prefer: RunningPilot, other: RunningPilot, backend: int
) -> tuple[EnvoyProcess, int]:
    """The server Envoy, mTLS in front of the backend found through pilot's `shop` cluster."""
    boot = server_bootstrap(
        prefer.grpc_port, SERVER, backend_port=backend, example="envoy-ads-delta.yaml"
    )
    boot = drop_static_cluster(reroute(boot, MTLS_LISTENER, cluster_name("shop")), BACKEND_CLUSTER)
    boot = list_pilots(boot, [prefer.grpc_port, other.grpc_port])
    server = await stack.enter_async_context(EnvoyProcess(boot, workdir / "server", "server"))
    await wait_for_own_cert(server, SERVER.uri)
    await server.wait_live(STARTUP)
    port = await server.wait_for(
        lambda: listener_port(server, MTLS_LISTENER), STARTUP, "the mTLS listener"
    )
    return server, port


async def start_client_envoy(
    stack: AsyncExitStack, workdir: Path, prefer: RunningPilot, other: RunningPilot, mtls: int
) -> tuple[EnvoyProcess, int]:
    """The client Envoy, plain HTTP in, mTLS to the server Envoy."""
    boot = client_bootstrap(
        prefer.grpc_port,
        CLIENT,
        server_port=mtls,
        server_san=SERVER.uri,
        example="envoy-ads-sotw.yaml",
    )
    boot = list_pilots(boot, [prefer.grpc_port, other.grpc_port])
    client = await stack.enter_async_context(EnvoyProcess(boot, workdir / "client", "client"))
    await wait_for_own_cert(client, CLIENT.uri)
    await client.wait_live(STARTUP)
    port = await client.wait_for(
        lambda: listener_port(client, PLAIN_LISTENER), STARTUP, "the HTTP listener"
    )
    await client.wait_for_stat(
        f"cluster.{SERVER_CLUSTER}.client_ssl_socket_factory.ssl_context_update_by_sds",
        lambda value: isinstance(value, int) and value >= 2,
        STARTUP,
    )
    return client, port


@asynccontextmanager
async def scene(tmp_path: Path) -> AsyncIterator[Scene]:
    """The mesh in the API server, replicas a then b, the server Envoy, the client Envoy."""
    async with AsyncExitStack() as stack:
        srv = await stack.enter_async_context(KubeAPIServer())
        backend = await stack.enter_async_context(Backend())
        mesh = PortMesh(
            srv, {"catalog": Svc(8080, CATALOG), "shop": Svc(backend.port, ("127.0.0.1",))}
        )
        stacks = {name: AsyncExitStack() for name in ("a", "b")}
        replicas = {}
        for name, replica_stack in stacks.items():
            stack.push_async_callback(replica_stack.aclose)
            kubeconfig = kubeconfig_for(srv, tmp_path / name)
            replicas[name] = await replica_stack.enter_async_context(running_kube_pilot(kubeconfig))
        a, b = replicas["a"], replicas["b"]
        server, mtls_port = await start_server_envoy(stack, tmp_path, a, b, backend.port)
        client, http_port = await start_client_envoy(stack, tmp_path, b, a, mtls_port)
        yield Scene(
            srv,
            backend,
            mesh,
            replicas,
            stacks,
            server,
            client,
            mtls_port,
            f"http://127.0.0.1:{http_port}",
        )


async def assert_each_envoy_on_its_own_replica(s: Scene) -> dict[str, int]:
    """Each Envoy holds a certificate from its replica, under the one root; the serials."""
    a, b = s.replicas["a"], s.replicas["b"]
    assert security_of(b).ca.root_pem == s.root_pem, "one root for both replicas"
    await s.srv.wait_for_watches(2, kind="EndpointSlice")  # each replica watches for itself
    assert set(proxies_on(a)) == {SERVER.node_id}
    assert set(proxies_on(b)) == {CLIENT.node_id}
    serials = {
        "server": await holds_cert_from(s.server, a, SERVER),
        "client": await holds_cert_from(s.client, b, CLIENT),
    }
    for pilot, proxy in ((a, SERVER), (b, CLIENT)):
        served = served_workload(security_of(pilot).secrets, proxy)
        assert served is not None and served.signed_by(s.root_pem)
    for envoy in (s.server, s.client):
        assert {cert.serial for cert in await ca_certs(envoy)} == {s.root_serial}
        assert set((await connection_gauges(envoy)).values()) == {1}
    return serials


async def assert_mtls_from_client(s: Scene, pilot: RunningPilot) -> None:
    """The last request reached the backend through both Envoys over mTLS, the client
    presenting the certificate `pilot` serves it."""
    seen = s.backend.seen[-1]
    assert (seen.xfcc_field("URI"), seen.xfcc_field("By")) == (CLIENT.uri, SERVER.uri)
    client_leaf = served_workload(security_of(pilot).secrets, CLIENT)
    assert client_leaf is not None
    assert seen.xfcc_field("Hash") == client_leaf.leaf_sha256


async def assert_server_presents_cert_from(s: Scene, pilot: RunningPilot, workdir: Path) -> None:
    """A TLS client with a certificate of `pilot`'s CA gets through the server Envoy, which
    presents the certificate `pilot` serves it."""
    probe = probe_credentials(security_of(pilot).ca, PROBE)
    outcome = await tls_get(s.mtls_port, s.root_pem, workdir, client_pem=probe)
    server_leaf = served_workload(security_of(pilot).secrets, SERVER)
    assert server_leaf is not None
    assert (outcome.status_line, outcome.peer_serial) == ("HTTP/1.1 200 OK", server_leaf.serial)


@dataclass(frozen=True)
class Failover:
    """Which Envoy moves when which replica stops."""

    moving: EnvoyProcess
    staying: EnvoyProcess
    proxy: Proxy  # the moving Envoy's
    other: Proxy  # the staying Envoy's
    victim: str  # the replica that stops
    survivor: RunningPilot

    @classmethod
    def of(cls, s: Scene, moved: str) -> Failover:
        if moved == "server":
            return cls(s.server, s.client, SERVER, CLIENT, "a", s.replicas["b"])
        return cls(s.client, s.server, CLIENT, SERVER, "b", s.replicas["a"])


async def wait_until_moved(f: Failover, streams: int) -> int:
    """Wait until the moving Envoy has all its streams on the survivor, connected, and
    holds the certificate the survivor serves it; that certificate's serial."""
    await f.moving.wait_for(
        lambda: len(streams_of(f.survivor, f.proxy)),
        15,
        f"all {streams} streams of {f.proxy.node_id} to reconnect to the survivor",
        until=lambda count: count == streams,
    )
    await f.moving.wait_for(
        lambda: connection_gauges(f.moving),
        15,
        "every xDS stream of the moved Envoy to be connected again",
        until=lambda gauges: set(gauges.values()) == {1},
    )
    return await holds_cert_from(f.moving, f.survivor, f.proxy)


@pytest.mark.envoy
@pytest.mark.parametrize("moved", ["server", "client"])
async def test_envoys_fail_over_to_the_other_replica_without_a_failed_request(
    tmp_path: Path, moved: str
) -> None:
    async with scene(tmp_path) as s:
        await s.mesh.converge([s.server, s.client], "the initial mesh")
        serials = await assert_each_envoy_on_its_own_replica(s)

        # mTLS between Envoys of different replicas.
        async with Traffic(s.url, BACKEND_BODY) as traffic:
            await wait_until(lambda: traffic.count >= 1, 10, "a first request")
        assert traffic.failures == [], traffic.report()
        await assert_mtls_from_client(s, s.replicas["b"])
        await assert_server_presents_cert_from(s, s.replicas["a"], tmp_path)

        # Stop the replica one Envoy is connected to, with requests flowing.
        f = Failover.of(s, moved)
        streams = len(streams_of(s.replicas[f.victim], f.proxy))
        staying_streams = streams_of(f.survivor, f.other)
        presence = [s.mesh.monitor(envoy) for envoy in (s.server, s.client)]
        certs = {
            "server": CertMonitor(s.server, SERVER.uri, s.root_serial),
            "client": CertMonitor(s.client, CLIENT.uri, s.root_serial),
        }
        traffic = Traffic(s.url, BACKEND_BODY)
        async with AsyncExitStack() as watching:
            for monitor in presence:
                await watching.enter_async_context(monitor)
            for cert_monitor in certs.values():
                await watching.enter_async_context(cert_monitor)
            await watching.enter_async_context(traffic)
            await wait_until(lambda: traffic.count >= 5, 10, "requests before the stop")
            before_stop = traffic.count
            await s.stacks[f.victim].aclose()
            new_serial = await wait_until_moved(f, streams)
            during = traffic.count - before_stop
            assert new_serial != serials[moved], "the survivor minted its own certificate"
            s.mesh.edit("catalog scaled up", catalog=Svc(8080, (*CATALOG, "127.0.1.3")))
            await s.mesh.converge([f.moving, f.staying], "the survivor's push after the failover")
            after = traffic.count
            await wait_until(
                lambda: traffic.count >= after + AFTER_FAILOVER, 10, "requests after the failover"
            )

        assert traffic.failures == [], traffic.report()
        assert during >= 1, "requests went on while the Envoy moved"
        for monitor in presence:
            await monitor.assert_never_lost()
        for cert_monitor in certs.values():
            cert_monitor.assert_always_valid()
        # The moved Envoy switched certificates once; the other one kept its own, and
        # its streams were not touched.
        stayed = "client" if moved == "server" else "server"
        assert certs[moved].serials == [serials[moved], new_serial]
        assert certs[stayed].serials == [serials[stayed]]
        assert streams_of(f.survivor, f.other) == staying_streams
        assert set(proxies_on(f.survivor)) == {SERVER.node_id, CLIENT.node_id}
        served = served_workload(security_of(f.survivor).secrets, f.proxy)
        assert served is not None and served.signed_by(s.root_pem)
        # The certificates in use are now the survivor's.
        await assert_mtls_from_client(s, f.survivor)
        await assert_server_presents_cert_from(s, f.survivor, tmp_path)
