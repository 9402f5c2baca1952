"""Remote clusters: one `KubernetesRegistry` per remote cluster id, added, replaced and
removed by id, each with a status; and `RemoteSecrets`, which keeps them equal to the
Secrets labelled `istio/multiCluster: "true"` in pilot's namespace (Istio's multi-primary
model: each data key a cluster id, its value a kubeconfig).

Clusters come from `--remote-kubeconfig ID=PATH` (fixed at start) and from those Secrets
(live); both go through `RemoteClusters`. A kubeconfig is loaded from its text, never
written out by pilot, and never logged: errors name the cluster and where its kubeconfig
came from, never what it holds.

Faults stay per cluster: each cluster's informers retry on their own with backoff and
keep what they delivered, so an unreachable cluster keeps its last endpoints and delays
nobody. Only removing a cluster (its Secret or key gone) removes its services and
endpoints.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import logging
from dataclasses import dataclass

import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException

from pilot.registry.updater import RegistryUpdater
from pilot.sources.kubernetes.config import KubernetesSettings, KubernetesUnavailable
from pilot.sources.kubernetes.informer import Informer, Obj
from pilot.sources.kubernetes.registry import KubernetesRegistry, Watching

log = logging.getLogger("pilot.sources.kubernetes")

MULTICLUSTER_SELECTOR = "istio/multiCluster=true"
_REASON_CHARS = 120


class KubeconfigError(KubernetesUnavailable):
    """A kubeconfig that does not load; the message never quotes it."""


class ClusterConflict(ValueError):
    """A remote cluster id that names the local cluster, or one already taken."""


async def client_from_kubeconfig(text: str) -> tuple[client.ApiClient, str]:
    """An API client from a kubeconfig's text, and the server it names."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        raise KubeconfigError("the kubeconfig is not YAML") from None
    if not isinstance(document, dict):
        raise KubeconfigError("the kubeconfig is not a mapping")
    configuration = client.Configuration()
    try:
        await config.load_kube_config_from_dict(document, client_configuration=configuration)
    except (ConfigException, ValueError, TypeError, KeyError, AttributeError, OSError) as error:
        # The library's messages may quote the document: say only what kind of failure.
        raise KubeconfigError(f"the kubeconfig does not load ({type(error).__name__})") from None
    if not configuration.host:
        raise KubeconfigError("the kubeconfig names no server")
    return client.ApiClient(configuration), str(configuration.host)


def cluster_status(informers: list[Informer], synced: bool) -> str:
    """`synced`, `syncing`, or `unreachable: REASON` while its informers fail."""
    errors = [informer.error for informer in informers if informer.error]
    if errors:
        reason = " ".join(errors[0].split())
        return f"unreachable: {reason[:_REASON_CHARS]}"
    return "synced" if synced else "syncing"


def _fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class RemoteCluster:
    """One remote cluster being watched."""

    cluster: str
    origin: str  # where its kubeconfig came from: a flag, or a Secret's key
    fingerprint: str  # of the kubeconfig: tells a change without keeping it
    registry: KubernetesRegistry
    api_client: client.ApiClient

    @property
    def status(self) -> str:
        return cluster_status(self.registry.informers, self.registry.synced)

    @property
    def healthy(self) -> bool:
        return self.status == "synced"

    async def stop(self) -> None:
        await self.registry.stop()
        await self.api_client.close()


class RemoteClusters:
    """The remote clusters pilot watches, by id; the local one is never among them."""

    def __init__(
        self,
        settings: KubernetesSettings,
        updater: RegistryUpdater,
        local_cluster: str,
        watching: Watching | None = None,
    ) -> None:
        self._settings = settings
        self._updater = updater
        self.local_cluster = local_cluster
        self._watching = watching  # each cluster's informers run under its supervisor
        self._clusters: dict[str, RemoteCluster] = {}
        self._lock = asyncio.Lock()

    def __contains__(self, cluster: str) -> bool:
        return cluster in self._clusters

    def __len__(self) -> int:
        return len(self._clusters)

    def origin(self, cluster: str) -> str:
        return self._clusters[cluster].origin

    def statuses(self) -> dict[str, str]:
        """Cluster id -> its status, by id."""
        return {cid: self._clusters[cid].status for cid in sorted(self._clusters)}

    def healthy(self) -> dict[str, bool]:
        """Cluster id -> synced and reachable."""
        return {cid: self._clusters[cid].healthy for cid in sorted(self._clusters)}

    async def add(self, cluster: str, kubeconfig: str, origin: str) -> None:
        """Start watching `cluster`. Raises ClusterConflict or KubeconfigError."""
        async with self._lock:
            if cluster == self.local_cluster:
                raise ClusterConflict(f"{origin}: {cluster!r} is the local cluster's id")
            if cluster in self._clusters:
                raise ClusterConflict(f"{origin}: cluster {cluster!r} is already watched")
            await self._start(cluster, kubeconfig, origin, None)

    async def replace(self, cluster: str, kubeconfig: str, origin: str) -> bool:
        """Watch `cluster` through a new kubeconfig (add it if new); False if unchanged.

        What the old watch delivered stays until the new one has listed: then only
        what the new one does not hold goes. Raises KubeconfigError (the old watch
        then goes on) or ClusterConflict.
        """
        async with self._lock:
            if cluster == self.local_cluster:
                raise ClusterConflict(f"{origin}: {cluster!r} is the local cluster's id")
            old = self._clusters.get(cluster)
            if old is not None and old.fingerprint == _fingerprint(kubeconfig):
                return False
            await self._start(cluster, kubeconfig, origin, old)
            return True

    async def remove(self, cluster: str) -> None:
        """Stop watching `cluster` and drop its services and endpoints."""
        async with self._lock:
            remote = self._clusters.pop(cluster, None)
            if remote is None:
                return
            await remote.stop()
            self._updater.replace_cluster(cluster, [], [])
            log.info("cluster %s: removed (%s)", cluster, remote.origin)

    async def stop(self) -> None:
        """Stop every watch; what they delivered stays (pilot is stopping)."""
        async with self._lock:
            for remote in self._clusters.values():
                await remote.stop()
            self._clusters.clear()

    async def _start(
        self, cluster: str, kubeconfig: str, origin: str, old: RemoteCluster | None
    ) -> None:
        api_client, server = await client_from_kubeconfig(kubeconfig)
        registry = KubernetesRegistry(
            self._settings, self._updater, api_client, server, cluster, watching=self._watching
        )
        if old is not None:
            await old.stop()  # its informers' state passes to the new ones
        await registry.start(old.registry if old is not None else None)
        self._clusters[cluster] = RemoteCluster(
            cluster, origin, _fingerprint(kubeconfig), registry, api_client
        )
        log.info("cluster %s: %s (%s)", cluster, "replaced" if old else "added", origin)


class RemoteSecrets:
    """The handler of the informer on multi-cluster Secrets; `run` applies what they say.

    Upserts and deletes only record the Secrets' data and wake `run`, which then adds,
    replaces and removes clusters one at a time. A key naming the local cluster, a
    value that is not base64 or not a kubeconfig, and an id another source already
    watches are each warned about once (naming the Secret and the key) and ignored.
    """

    def __init__(self, clusters: RemoteClusters, namespace: str) -> None:
        self._clusters = clusters
        self._namespace = namespace
        self._secrets: dict[str, dict[str, str]] = {}  # Secret name -> key -> base64 value
        self._owned: set[str] = set()  # the cluster ids that come from Secrets
        self._warned: set[tuple[str, str]] = set()  # (origin, fingerprint) already warned
        self._changed = asyncio.Event()

    # -- InformerHandler -----------------------------------------------------------

    def upsert(self, obj: Obj) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        data = obj.get("data") or {}
        self._secrets[name] = {str(k): str(v) for k, v in data.items()}
        self._changed.set()

    def delete(self, namespace: str, name: str) -> None:
        self._secrets.pop(name, None)
        self._changed.set()

    # -- applying ------------------------------------------------------------------

    async def run(self) -> None:
        """Forever: once something changed, make the remote clusters what the Secrets say."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            await self.reconcile()

    def _origin(self, secret: str, key: str) -> str:
        return f"Secret {self._namespace}/{secret} key {key}"

    def _warn_once(self, origin: str, value: str, problem: str) -> None:
        if (origin, _fingerprint(value)) not in self._warned:
            self._warned.add((origin, _fingerprint(value)))
            log.warning("%s: %s; ignored", origin, problem)

    def _wanted(self) -> dict[str, tuple[str, str]]:
        """Cluster id -> (origin, kubeconfig text): the first Secret (by name) to name it."""
        wanted: dict[str, tuple[str, str]] = {}
        for secret in sorted(self._secrets):
            for key, value in sorted(self._secrets[secret].items()):
                origin = self._origin(secret, key)
                if key == self._clusters.local_cluster:
                    self._warn_once(origin, value, "it names the local cluster")
                    continue
                if key in wanted:
                    self._warn_once(origin, value, f"cluster {key} is also in {wanted[key][0]}")
                    continue
                try:
                    text = base64.b64decode(value, validate=True).decode()
                except (binascii.Error, UnicodeDecodeError):
                    self._warn_once(origin, value, "the value is not base64 of a kubeconfig")
                    continue
                wanted[key] = (origin, text)
        return wanted

    async def reconcile(self) -> None:
        wanted = self._wanted()
        for cluster in sorted(self._owned - wanted.keys()):
            await self._clusters.remove(cluster)
            self._owned.discard(cluster)
        for cluster, (origin, text) in wanted.items():
            if cluster in self._clusters and cluster not in self._owned:
                other = self._clusters.origin(cluster)
                self._warn_once(origin, text, f"cluster {cluster} is already watched ({other})")
                continue
            try:
                await self._clusters.replace(cluster, text, origin)
            except (KubeconfigError, ClusterConflict) as error:
                self._warn_once(origin, text, str(error).removeprefix(f"{origin}: "))
                continue
            self._owned.add(cluster)


def secret_informer(
    api_client: client.ApiClient,
    namespace: str,
    handler: RemoteSecrets,
    settings: KubernetesSettings,
) -> Informer:
    """The informer on the multi-cluster Secrets of pilot's own namespace (list, watch)."""
    request = functools.partial(client.CoreV1Api(api_client).list_namespaced_secret, namespace)
    return Informer("Secret", request, handler, settings.informer, MULTICLUSTER_SELECTOR)
