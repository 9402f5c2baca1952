"""`pilot agent`: pilot's SDS component next to Envoy, so private keys never leave the node.

Like Istio's node agent: serves `envoy.service.secret.v3.SecretDiscoveryService`
on a Unix socket, takes its identity from POD_NAMESPACE / SERVICE_ACCOUNT and
its token from CA_TOKEN_FILE, and sends CSRs to CA_ADDR, which defaults to the
discovery address (pilot's TLS port, as Istio's agent uses istiod's 15012).

The CA is reached over TLS verified with the root in CA_ROOT_CERT (default
Istio's `./var/run/secrets/istio/root-cert.pem`, where the `istio-ca-root-cert`
ConfigMap is mounted); plaintext only with CA_INSECURE=true. That root, never
one a CA hands back, is what Envoy gets as `ROOTCA` and what every chain must
lead to. The socket's directory is private (`pilot.security.sds_socket`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from grpc import aio

from pilot.generators.sds import SecretGenerator
from pilot.push.pipeline import Pipeline
from pilot.security import sds_socket
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
from pilot.supervisor import Supervisor
from pilot.xds.cache import ResourceCache

log = logging.getLogger("pilot.agent")

DEFAULT_SOCKET = Path("./var/run/secrets/workload-spiffe-uds/socket")
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


def agent_settings(
    socket: Path,
    discovery_address: str,
    trust_domain: str,
    key_type: KeyType,
    env: Mapping[str, str] | None = None,
) -> AgentSettings:
    """Resolve the agent's identity and CA from the environment."""
    env = os.environ if env is None else env
    identity = own_identity(env, trust_domain)
    if identity is None:
        raise SecuritySettingsError("pilot agent needs POD_NAMESPACE and SERVICE_ACCOUNT")
    remote = remote_ca_from_env(env, trust_domain, discovery_address, DEFAULT_ROOT_CERT)
    if remote is None:
        raise SecuritySettingsError("pilot agent needs --discovery-address or CA_ADDR")
    return AgentSettings(socket, identity, remote, key_type)


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

    async def start(self) -> None:
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

    async def stop(self) -> None:
        self.streams.connections.close_all()
        await self.server.stop(1.0)
        await self.supervisor.stop()
        await self.secrets.close()
        await self.ca.close()
        self.settings.socket.unlink(missing_ok=True)
