"""What pilot does only with a Kubernetes API, behind one door.

Kubernetes' client (kubernetes_asyncio) takes 0.7 s to import, about half of a start
from a file, which never calls it; `pilot agent` and `pilot proxy-status` never need
it either. So everything that needs it is reached through this module, which the
composition root (`pilot.app`) imports at one place, the first time it has a
Kubernetes API to call: the connection, the cluster source, remote clusters and
their Secrets, the root's ConfigMaps, the injection webhook's caBundle, and security's
Lease, shared root and TokenReview (`ClusterSecurity`, handed to
`pilot.security.component.Security`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kubernetes_asyncio import client

from pilot.kube.config import KubernetesSettings
from pilot.kube.connection import connect
from pilot.kube.informer import Informer, WatchFaults, Watching
from pilot.kube.remote_settings import RemoteSettings
from pilot.limits import LimitHits
from pilot.registry.updater import RegistryUpdater
from pilot.runtime.supervisor import Supervisor
from pilot.security.authn import TokenReviewer
from pilot.security.ca import CertificateAuthority
from pilot.security.lease import LeaseElector
from pilot.security.root_publisher import RootPublisher
from pilot.security.root_store import LEASE_NAME, SharedRoot
from pilot.security.settings import SecuritySettings
from pilot.security.token_review import KubernetesTokenReviewer
from pilot.sources.kubernetes.cluster_source import ClusterSource
from pilot.sources.kubernetes.clusters import RemoteClusters, RemoteSecrets, secret_informer
from pilot.webhook.ca_bundle import CaBundleKeeper


class KubernetesMode:
    """The parts of pilot that call a Kubernetes API."""

    async def connect(self, kubeconfig: Path | None) -> tuple[client.ApiClient, str]:
        """An API client for the configured cluster, and its server's URL."""
        return await connect(kubeconfig)

    def security(self, api_client: client.ApiClient) -> ClusterSecurity:
        return ClusterSecurity(api_client)

    def cluster_source(
        self,
        settings: KubernetesSettings,
        updater: RegistryUpdater,
        api_client: client.ApiClient,
        api_server: str,
        cluster_id: str,
        *,
        watching: Watching,
        cluster_domain: str = "cluster.local",
    ) -> ClusterSource:
        """The local cluster as the registry's source (Istio's config is read here only)."""
        return ClusterSource(
            settings,
            updater,
            api_client,
            api_server,
            cluster_id,
            watching=watching,
            peer_authentications=True,
            cluster_domain=cluster_domain,
        )

    def remote_clusters(
        self,
        settings: KubernetesSettings,
        updater: RegistryUpdater,
        local_cluster: str,
        remote: RemoteSettings,
        hits: LimitHits,
        *,
        watching: Watching,
    ) -> RemoteClusters:
        return RemoteClusters(settings, updater, local_cluster, remote, hits, watching=watching)

    def remote_secrets(
        self,
        api_client: client.ApiClient,
        remotes: RemoteClusters,
        namespace: str,
        settings: KubernetesSettings,
        faults: WatchFaults,
    ) -> tuple[RemoteSecrets, Informer]:
        """The `istio/multiCluster` Secrets of pilot's namespace: their handler and informer."""
        handler = RemoteSecrets(remotes, namespace)
        return handler, secret_informer(api_client, namespace, handler, settings, faults)

    def root_publisher(
        self,
        api_client: client.ApiClient,
        settings: KubernetesSettings,
        root_pem: Callable[[], str],
        elector: LeaseElector,
        supervisor: Supervisor,
    ) -> RootPublisher:
        """ConfigMap istio-ca-root-cert in every watched namespace, written by the holder."""
        return RootPublisher(api_client, settings, root_pem, elector, supervisor=supervisor)

    def ca_bundle_keeper(
        self,
        api_client: client.ApiClient,
        settings: KubernetesSettings,
        name: str,
        root_pem: Callable[[], str],
        supervisor: Supervisor,
    ) -> CaBundleKeeper:
        """The caBundle of the MutatingWebhookConfiguration `name`, kept at pilot's root."""
        return CaBundleKeeper(api_client, settings, name, root_pem, supervisor)


class ClusterSecurity:
    """Security's parts that need the API: the Lease, the shared root, TokenReview."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._api_client = api_client

    def elector(self, settings: SecuritySettings) -> LeaseElector:
        """The Lease pilot-ca, held by the replica that does the CA's single-writer duties."""
        duration = settings.lease_duration
        return LeaseElector(
            self._api_client, settings.namespace, LEASE_NAME, lease_duration=duration
        )

    async def shared_root(
        self, settings: SecuritySettings, elector: LeaseElector
    ) -> CertificateAuthority:
        """The root the replicas share through Secret pilot-ca-secret."""
        return await SharedRoot(self._api_client, settings.namespace, settings.ca, elector).load()

    def token_reviewer(self) -> TokenReviewer:
        return KubernetesTokenReviewer(self._api_client)
