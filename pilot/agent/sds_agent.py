"""`pilot agent`: pilot's SDS component next to Envoy, so private keys never leave the node.

Like Istio's node agent: serves `envoy.service.secret.v3.SecretDiscoveryService`
on a Unix socket, takes its identity from POD_NAMESPACE / SERVICE_ACCOUNT and
its token from CA_TOKEN_FILE, and sends CSRs to CA_ADDR, which defaults to the
discovery address (pilot's TLS port, as Istio's agent uses istiod's 15012).

The CA is reached over TLS verified with the root in CA_ROOT_CERT (default
Istio's `./var/run/secrets/istio/root-cert.pem`, where the `istio-ca-root-cert`
ConfigMap is mounted); plaintext only with CA_INSECURE=true. That root, never
one a CA hands back, is what Envoy gets as `ROOTCA` and what every chain must
lead to. The socket's directory is private (`pilot.agent.sds_socket`).

With `proxy` (Envoy found on PATH) or `--binary-path` the agent also brings the
sidecar up, as Istio's pilot-agent does: once SDS serves, it writes Envoy's bootstrap
(`pilot.agent.bootstrap`: node id from POD_NAME, INSTANCE_IP and the identity,
ADS to the discovery address over TLS verified with the same root, SDS on this
socket) and starts Envoy (`pilot.agent.envoy`); on SIGTERM Envoy stops first.
Before anything else it binds the status port, 15020 (`pilot.agent.status_port`:
`/healthz/ready`, `/quitquitquit` from the pod itself, the app's rewritten probes from
ISTIO_KUBE_APP_PROBERS, `pilot.agent.app_probes`), which the capture rules leave
uncaptured: an app must never hold it, so a port already taken stops the agent
before it starts.
`pilot agent bootstrap` prints that bootstrap instead, and `pilot agent
iptables` (`pilot.agent.iptables`) sets the capture rules.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from grpc import aio

from pilot.agent import sds_socket
from pilot.agent.app_probes import AppProber, probers_from_env
from pilot.agent.bootstrap import ADMIN_PORT, Json, ProxyNode, XdsTarget, bootstrap
from pilot.agent.envoy import EnvoyChild, EnvoySettings, write_bootstrap
from pilot.agent.status_port import DEFAULT_STATUS_PORT, StatusRoutes, StatusServer
from pilot.generators.sds import SecretGenerator
from pilot.push.pipeline import Pipeline
from pilot.runtime.supervisor import Supervisor
from pilot.security.ca_client import RemoteCa, RemoteCaSettings
from pilot.security.certs import KeyType
from pilot.security.identity import Identity
from pilot.security.secrets import SecretManager
from pilot.security.settings import (
    SecuritySettingsError,
    own_identity,
    remote_ca_from_env,
    sds_from_env,
)
from pilot.security.xds_auth import FixedIdentity
from pilot.server.connection import StreamContext
from pilot.server.services import sds_handlers
from pilot.stats import XdsStats
from pilot.xds.cache import ResourceCache

log = logging.getLogger("pilot.agent")

DEFAULT_SOCKET = Path("./var/run/secrets/workload-spiffe-uds/socket")
# `pilot agent proxy`: the paths of Istio's injected volumes (workload-socket, istiod-ca-cert).
SIDECAR_SOCKET = Path("/var/run/secrets/workload-spiffe-uds/socket")
SIDECAR_ROOT_CERT = Path("/var/run/secrets/istio/root-cert.pem")
# pilot's TLS port through the Service in deploy/ (Istio's agent: istiod.istio-system.svc:15012).
DEFAULT_DISCOVERY_ADDRESS = "pilot.pilot-system.svc:15012"
# Where Istio mounts the istio-ca-root-cert ConfigMap; relative to the working directory.
DEFAULT_ROOT_CERT = Path("./var/run/secrets/istio/root-cert.pem")


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Flags and environment of `pilot agent`."""

    socket: Path
    identity: Identity
    remote_ca: RemoteCaSettings
    key_type: KeyType = KeyType.EC
    discovery_address: str = DEFAULT_DISCOVERY_ADDRESS
    envoy: EnvoySettings | None = None  # --binary-path: start Envoy
    node: ProxyNode | None = None  # with envoy, or for `pilot agent bootstrap`
    status_port: int = DEFAULT_STATUS_PORT  # --status-port, with envoy only; 0: none
    probers: Mapping[str, AppProber] | None = None  # ISTIO_KUBE_APP_PROBERS, with envoy

    def bootstrap(self) -> Json:
        """Envoy's bootstrap for this sidecar (needs `node`)."""
        assert self.node is not None
        target = XdsTarget(
            self.discovery_address, self.remote_ca.root_cert, self.remote_ca.token_file
        )
        return bootstrap(self.node, target, self.socket)


def agent_settings(
    socket: Path,
    discovery_address: str,
    trust_domain: str,
    key_type: KeyType,
    env: Mapping[str, str] | None = None,
    *,
    envoy: EnvoySettings | None = None,
    sidecar: bool = False,
    cluster_domain: str = "cluster.local",
    status_port: int = DEFAULT_STATUS_PORT,
    default_root: Path = DEFAULT_ROOT_CERT,
) -> AgentSettings:
    """Resolve the agent's identity and CA from the environment.

    With `envoy` (or `sidecar`: the bootstrap is wanted) the pod's node too
    (POD_NAME, INSTANCE_IP), and the discovery address must be HOST:PORT;
    BootstrapError otherwise. The socket is where `sds_socket.resolve` puts it.
    """
    env = os.environ if env is None else env
    identity = own_identity(env, trust_domain)
    if identity is None:
        raise SecuritySettingsError("pilot agent needs POD_NAMESPACE and SERVICE_ACCOUNT")
    remote = remote_ca_from_env(env, trust_domain, discovery_address, default_root)
    if remote is None:
        raise SecuritySettingsError("pilot agent needs --discovery-address or CA_ADDR")
    node = None
    if envoy is not None or sidecar:
        node = ProxyNode.from_env(env, identity, cluster_domain)
        XdsTarget(discovery_address, remote.root_cert)  # checked before anything starts
    if envoy is not None:
        EnvoyChild.check_user(node.interception_mode if node else "")
    probers = probers_from_env(env, node.ip) if envoy is not None and node else None
    return AgentSettings(
        sds_socket.resolve(socket),
        identity,
        remote,
        key_type,
        discovery_address,
        envoy,
        node,
        status_port,
        probers,
    )


class Agent:
    """A running node agent: SDS on a Unix socket."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.stats = XdsStats()
        self.ca = RemoteCa(settings.remote_ca)
        sds = sds_from_env(os.environ, settings.key_type)
        self.secrets = SecretManager(self.ca, self.ca.root_pem, sds)
        cache = ResourceCache()
        sds_generator = SecretGenerator(self.secrets, cache, self.stats)
        self.pipeline = Pipeline(cache, self.stats, [sds_generator])
        self.streams = StreamContext(
            self.pipeline, self.stats, auth=FixedIdentity(settings.identity)
        )
        self.server = aio.server()
        self.server.add_generic_rpc_handlers(tuple(sds_handlers(self.streams)))
        self.supervisor = Supervisor()
        self.envoy = (
            EnvoyChild(settings.envoy, self._envoy_exited) if settings.envoy is not None else None
        )
        routes = StatusRoutes(
            on_quit=self._quit,
            probers=settings.probers,
            pod_ip=settings.node.ip if settings.node else "",
        )
        self.status = (
            StatusServer(settings.status_port, ADMIN_PORT, routes=routes)
            if settings.envoy is not None and settings.status_port
            else None
        )
        self.exit_status = 0

    def _quit(self) -> None:
        """POST /quitquitquit from the pod: stop as on SIGTERM, exit 0 (a Job's app is done)."""
        signal.raise_signal(signal.SIGTERM)

    def _envoy_exited(self, status: int) -> None:
        """Envoy went on its own: stop as on SIGTERM, and exit 1."""
        self.exit_status = 1
        signal.raise_signal(signal.SIGTERM)

    async def start(self) -> None:
        if self.status is not None:
            await self.status.start()  # first: the sooner it is held, the less an app can race
        elif self.settings.envoy is not None:
            log.warning(
                "--status-port 0: no status port; 15020 stays uncaptured by the default"
                " capture rules (-d), so whatever listens there is reached past Envoy"
            )
        socket = self.settings.socket
        sds_socket.prepare(socket)
        if self.server.add_insecure_port(f"unix:{socket}") == 0:
            raise OSError(f"cannot listen on {socket}")
        self.pipeline.publish_initial()  # nothing to build: certificates come when asked for
        self.supervisor.start("push", self.pipeline.run)
        await self.server.start()
        socket.chmod(sds_socket.SOCKET_MODE)  # secrets cross it: only Envoy's user may connect
        remote = self.settings.remote_ca
        if remote.insecure:
            log.warning("CA_INSECURE=true: CSRs and token go to %s in plaintext", remote.address)
        log.info(
            "pilot agent serving SDS on %s for %s, CA at %s (%s, root %s)",
            socket,
            self.settings.identity,
            remote.address,
            "plaintext" if remote.insecure else "TLS",
            remote.root_cert,
        )
        if self.envoy is not None:
            assert self.settings.envoy is not None
            try:
                path = write_bootstrap(self.settings.envoy.config_path, self.settings.bootstrap())
                await self.envoy.start(path)
            except OSError:
                await self.stop()  # the socket goes too: nothing is left serving for no Envoy
                raise

    async def stop(self) -> None:
        if self.envoy is not None:
            await self.envoy.stop()  # before SDS goes: Envoy drains with its certificates
        self.streams.connections.close_all()
        await self.server.stop(1.0)
        await self.supervisor.stop()
        await self.secrets.close()
        await self.ca.close()
        if self.status is not None:
            await self.status.stop()  # last: the port stays held while anything else runs
        self.settings.socket.unlink(missing_ok=True)
