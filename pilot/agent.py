"""`pilot agent`: pilot's SDS component next to Envoy, so private keys never leave the node.

Like Istio's node agent: serves `envoy.service.secret.v3.SecretDiscoveryService`
on a Unix socket, takes its identity from POD_NAMESPACE / SERVICE_ACCOUNT and
its token from CA_TOKEN_FILE, and sends CSRs to CA_ADDR, which defaults to the
discovery address (pilot's plaintext gRPC port, so plaintext unless
CA_ROOT_CERT is given).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from grpc import aio

from pilot.generators.sds import SecretGenerator
from pilot.push.pipeline import Pipeline
from pilot.security.ca_client import RemoteCa, RemoteCaSettings
from pilot.security.certs import KeyType
from pilot.security.identity import Identity
from pilot.security.secrets import SecretManager
from pilot.security.settings import SecuritySettingsError, own_identity, sds_from_env
from pilot.security.xds_auth import FixedIdentity
from pilot.server.connection import StreamContext
from pilot.server.services import sds_handlers
from pilot.stats import XdsStats
from pilot.xds.cache import ResourceCache

log = logging.getLogger("pilot.agent")

DEFAULT_SOCKET = Path("./var/run/secrets/workload-spiffe-uds/socket")


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
    address = env.get("CA_ADDR", "").strip() or discovery_address
    root = env.get("CA_ROOT_CERT", "").strip()
    insecure_flag = env.get("CA_INSECURE", "").strip().lower()
    insecure = insecure_flag in ("1", "true") or (not insecure_flag and not root)
    if not insecure and not root:
        raise SecuritySettingsError(f"CA_ADDR={address}: set CA_ROOT_CERT, or CA_INSECURE=true")
    token = env.get("CA_TOKEN_FILE", "").strip()
    remote = RemoteCaSettings(
        address=address,
        root_cert=Path(root) if root else None,
        insecure=insecure,
        token_file=Path(token) if token else None,
        own_identity=identity,
    )
    return AgentSettings(socket, identity, remote, key_type)


class Agent:
    """A running node agent: SDS on a Unix socket."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.stats = XdsStats()
        self.ca = RemoteCa(settings.remote_ca)
        sds = sds_from_env(os.environ, settings.key_type)
        self.secrets = SecretManager(self.ca, _root(settings.remote_ca), sds)
        cache = ResourceCache()
        sds_generator = SecretGenerator(self.secrets, cache, self.stats)
        self.pipeline = Pipeline(cache, self.stats, [sds_generator])
        self.streams = StreamContext(
            self.pipeline, self.stats, auth=FixedIdentity(settings.identity)
        )
        self.server = aio.server()
        self.server.add_generic_rpc_handlers(tuple(sds_handlers(self.streams)))
        self._pushing: asyncio.Task[None] | None = None

    async def start(self) -> None:
        socket = self.settings.socket
        socket.parent.mkdir(parents=True, exist_ok=True)
        socket.unlink(missing_ok=True)
        if self.server.add_insecure_port(f"unix:{socket.resolve()}") == 0:
            raise OSError(f"cannot listen on {socket}")
        self.pipeline.publish_initial()  # nothing to build: certificates come when asked for
        self._pushing = asyncio.create_task(self.pipeline.run(), name="push")
        await self.server.start()
        socket.chmod(0o600)  # secrets cross it: only Envoy's user may connect
        log.info(
            "pilot agent serving SDS on %s for %s, CA at %s",
            socket,
            self.settings.identity,
            self.settings.remote_ca.address,
        )

    async def stop(self) -> None:
        self.streams.connections.close_all()
        await self.server.stop(1.0)
        if self._pushing is not None:
            self._pushing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pushing
        await self.secrets.close()
        await self.ca.close()
        self.settings.socket.unlink(missing_ok=True)


def _root(remote: RemoteCaSettings) -> str | None:
    return remote.root_cert.read_text() if remote.root_cert is not None else None
