"""Wires the security pieces for `pilot discovery`: CA, CA service, CA client, SDS, identities."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pilot.limits import Admission
from pilot.security.authn import Authenticator, TokenReviewer
from pilot.security.batches import signing_lane
from pilot.security.ca import CertificateAuthority
from pilot.security.ca_client import CaClient, LocalCa, RemoteCa
from pilot.security.ca_service import CaService
from pilot.security.review_cache import CachedReviewer
from pilot.security.secrets import SecretManager
from pilot.security.settings import SecuritySettings
from pilot.security.static_tokens import load_token_file
from pilot.security.xds_auth import ProxyIdentities, XdsAuth

if TYPE_CHECKING:
    # Kubernetes' client takes 0.7 s to import: what needs it (the Lease, the shared root,
    # TokenReview) comes from `pilot.kubernetes_mode`, only with a Kubernetes API to call.
    from pilot.security.lease import LeaseElector

SIGNING_SLOTS = 4


class KubernetesSecurity(Protocol):
    """What security needs of a Kubernetes API (`pilot.kubernetes_mode.ClusterSecurity`)."""

    def elector(self, settings: SecuritySettings) -> LeaseElector:
        """The Lease pilot-ca, held by the replica that does the CA's single-writer duties."""
        ...

    async def shared_root(
        self, settings: SecuritySettings, elector: LeaseElector
    ) -> CertificateAuthority:
        """The root the replicas share through Secret pilot-ca-secret."""
        ...

    def token_reviewer(self) -> TokenReviewer: ...


@dataclass
class Security:
    """The running security component."""

    ca: CertificateAuthority
    ca_service: CaService
    secrets: SecretManager
    identities: ProxyIdentities
    remote: RemoteCa | None
    elector: LeaseElector | None = None

    @classmethod
    async def create(
        cls,
        settings: SecuritySettings,
        kubernetes: KubernetesSecurity | None,
        default_xds_auth: XdsAuth,
        *,
        shared_root: bool = False,
        observe_ca_latency: Callable[[float], None] = lambda seconds: None,
        admission: Admission | None = None,
    ) -> Security:
        """Load (or make) the CA root and build everything around it.

        With a Kubernetes API and no --config, replicas elect one writer for CA
        duties (the Lease pilot-ca); without --ca-cert-dir, the root is the one
        they share through Secret pilot-ca-secret.
        """
        elector = None
        if shared_root and kubernetes is not None:
            elector = kubernetes.elector(settings)
        if kubernetes is not None and elector is not None and settings.ca.cert_dir is None:
            ca = await kubernetes.shared_root(settings, elector)
        else:
            ca = await asyncio.to_thread(CertificateAuthority.load, settings.ca)
        admission = admission or Admission.unlimited()
        reviewer = await _token_reviewer(settings, kubernetes, ca.settings.trust_domain, admission)
        authenticator = Authenticator(
            ca.settings.trust_domain, reviewer, settings.token_audiences, [ca.signing_cert]
        )
        slots = asyncio.Semaphore(SIGNING_SLOTS)
        signing = signing_lane(slots)  # the CA service's CSRs and SDS's EC mints, one thread
        trusted = settings.trusted_node_accounts
        ca_service = CaService(ca, authenticator, trusted, signing, admission)
        remote = RemoteCa(settings.remote_ca) if settings.remote_ca is not None else None
        ca_client: CaClient = remote if remote is not None else LocalCa(ca, slots, signing)
        root_pem = remote.root_pem if remote is not None else ca.root_pem
        secrets = SecretManager(ca_client, root_pem, settings.sds, observe_ca_latency, admission)
        mode = settings.xds_auth or default_xds_auth
        identities = ProxyIdentities(mode, ca.settings.trust_domain, authenticator)
        return cls(ca, ca_service, secrets, identities, remote, elector)

    async def close(self) -> None:
        if self.elector is not None:
            await self.elector.release()
        await self.secrets.close()
        if self.remote is not None:
            await self.remote.close()


async def _token_reviewer(
    settings: SecuritySettings,
    kubernetes: KubernetesSecurity | None,
    trust_domain: str,
    admission: Admission,
) -> TokenReviewer | None:
    """TokenReview when there is a Kubernetes API, else --token-auth-file's tokens, if any."""
    if kubernetes is not None:
        reviewer = kubernetes.token_reviewer()
        return CachedReviewer(reviewer, admission.limits.token_cache, admission.hits)
    if settings.token_auth_file is not None:
        return await asyncio.to_thread(load_token_file, settings.token_auth_file, trust_domain)
    return None
