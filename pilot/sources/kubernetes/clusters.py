"""Remote clusters: one `ClusterSource` per remote cluster id, each with a status and
a lane of its own; and `RemoteSecrets`, which keeps them equal to the Secrets labelled
`istio/multiCluster: "true"` in pilot's namespace (Istio's multi-primary model: each data
key a cluster id, its value a kubeconfig).

Clusters come from `--remote-kubeconfig ID=PATH` (fixed at start, `RemoteClusters.add`)
and from those Secrets (live, `RemoteClusters.want`). A kubeconfig is data
(`kubeconfig.py`: parsed with bounds in a worker thread, checked, its client built in
memory), never written out by pilot, and never logged: errors name the cluster and
where its kubeconfig came from, never what it holds.

Faults stay per cluster. Each cluster id has a lane (`_Lane`, a task named
`remote-cluster-ID`) that applies the latest state wanted for it: building a client has
a deadline and is dropped as soon as a newer state is wanted, so a slow or hung
cluster delays no other cluster's add, change or removal, nor its own removal. Each
cluster's informers retry on their own with backoff and keep what they delivered. A
value that failed is not tried again until it changes.

A kubeconfig with `insecure-skip-tls-verify: true` (pilot cannot tell its API server
from whoever is on the path) is used with one warning naming the cluster each time
it is loaded, and counted in `pilot_remote_clusters_insecure_skip_tls_verify`; with
`--refuse-insecure-skip-tls-verify` it is refused instead: one error line naming the
cluster, counted under the refusal reason `insecure_skip_tls_verify`, and the
cluster's status (`/ready`) says `refused` until another value is wanted for it. A
`--remote-kubeconfig` so refused stops pilot at start, as any refused flag does.

Claims: a cluster id from Secrets belongs to the Secret that holds it; when no Secret
holds it, to the oldest claimant (metadata.creationTimestamp, then namespace/name). A
later claim is refused with a warning naming both until the holder lets go. At most
PILOT_MAX_REMOTE_CLUSTERS clusters are watched (flags first, then claims in that order).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import logging
from collections import Counter
from dataclasses import dataclass, field

from kubernetes_asyncio import client

from pilot.cluster_ids import is_cluster_id, quoted
from pilot.kube.config import KubernetesSettings
from pilot.kube.informer import Informer, Obj, WatchFaults, Watching, cluster_status
from pilot.kube.kubeconfig import (
    KubeconfigError,
    RemoteClient,
    api_client_for,
    load_credentials,
    plugin_api_client,
)
from pilot.kube.remote_settings import RemoteSettings
from pilot.limits import LimitExceeded, LimitHits
from pilot.registry.updater import RegistryUpdater
from pilot.runtime.memory import trim_heap
from pilot.sources.kubernetes.cluster_source import ClusterSource

__all__ = [
    "ClusterConflict",
    "InsecureRefused",
    "KubeconfigError",
    "RemoteClusters",
    "RemoteSecrets",
]

log = logging.getLogger("pilot.sources.kubernetes")

MULTICLUSTER_SELECTOR = "istio/multiCluster=true"
TRIM_AFTER = 1.0  # seconds after a removal: the heap is trimmed once the burst is over
_WARNED_KEPT = 10_000  # distinct warnings remembered (so each is logged once)


class ClusterConflict(ValueError):
    """A remote cluster id that names the local cluster, or one already taken."""


class InsecureRefused(KubeconfigError):
    """insecure-skip-tls-verify, and the operator refuses it."""


INSECURE_REFUSED = (
    "refused: the kubeconfig has insecure-skip-tls-verify: true (the API server's"
    " certificate would not be verified) and --refuse-insecure-skip-tls-verify is set"
)
INSECURE_REASON = "insecure_skip_tls_verify"


def _fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Wanted:
    """A kubeconfig wanted for a cluster id, and where it comes from."""

    origin: str
    kubeconfig: str
    fingerprint: str = field(default="", compare=False)

    @classmethod
    def of(cls, origin: str, kubeconfig: str) -> Wanted:
        return cls(origin, kubeconfig, _fingerprint(kubeconfig))


@dataclass
class RemoteCluster:
    """One remote cluster being watched."""

    cluster: str
    origin: str  # where its kubeconfig came from: a flag, or a Secret's key
    fingerprint: str  # of the kubeconfig: tells a change without keeping it
    registry: ClusterSource
    remote_client: RemoteClient

    @property
    def status(self) -> str:
        return cluster_status(self.registry.informers, self.registry.synced)

    @property
    def healthy(self) -> bool:
        return self.status == "synced"

    async def stop(self) -> None:
        await self.registry.stop()
        await self.remote_client.close()


@dataclass
class _Lane:
    """The latest state wanted for one cluster id, and the task applying it."""

    wanted: Wanted | None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class RemoteClusters:
    """The remote clusters pilot watches, by id; the local one is never among them."""

    def __init__(
        self,
        settings: KubernetesSettings,
        updater: RegistryUpdater,
        local_cluster: str,
        remote: RemoteSettings | None = None,
        hits: LimitHits | None = None,
        *,
        watching: Watching | None = None,
    ) -> None:
        self._settings = settings
        self._updater = updater
        self.local_cluster = local_cluster
        self.remote = remote or RemoteSettings()
        self.hits = hits or LimitHits()
        self.refusals: Counter[str] = Counter()  # distinct refusals by reason, for /metrics
        self.fixed: set[str] = set()  # the ids from --remote-kubeconfig
        self._watching = watching  # each cluster's informers run under its supervisor
        self._clusters: dict[str, RemoteCluster] = {}
        self._lanes: dict[str, _Lane] = {}
        self._warned: set[tuple[str, str, str]] = set()
        self._refused: dict[str, str] = {}  # cluster id -> why it is not watched (/ready)
        self._building = asyncio.Lock()
        self._trim: asyncio.TimerHandle | None = None

    def __contains__(self, cluster: str) -> bool:
        return cluster in self._clusters

    def __len__(self) -> int:
        return len(self._clusters)

    def origin(self, cluster: str) -> str:
        return self._clusters[cluster].origin

    def statuses(self) -> dict[str, str]:
        """Cluster id -> its status (`refused: ...` for one the operator's settings
        refused), by id."""
        found = {cid: remote.status for cid, remote in self._clusters.items()}
        refused = {cid: why for cid, why in self._refused.items() if cid not in found}
        return dict(sorted((found | refused).items()))

    def insecure(self) -> int:
        """Clusters watched through a kubeconfig with insecure-skip-tls-verify."""
        return sum(remote.remote_client.insecure for remote in self._clusters.values())

    def healthy(self) -> dict[str, bool]:
        """Cluster id -> synced and reachable."""
        return {cid: self._clusters[cid].healthy for cid in sorted(self._clusters)}

    def warn_once(self, origin: str, problem: str, reason: str, fingerprint: str = "") -> bool:
        """One warning per (origin, problem, value), counted under `reason`; True when
        this one is new."""
        key = (origin, problem, fingerprint)
        if key in self._warned:
            return False
        if len(self._warned) >= _WARNED_KEPT:
            self._warned.clear()
        self._warned.add(key)
        self.refusals[reason] += 1
        log.warning("%s: %s; ignored", origin, problem)
        return True

    # -- --remote-kubeconfig ---------------------------------------------------------

    async def add(self, cluster: str, kubeconfig: str, origin: str) -> None:
        """Start watching `cluster` (a flag's). Raises ClusterConflict or KubeconfigError."""
        if cluster == self.local_cluster:
            raise ClusterConflict(f"{origin}: {cluster!r} is the local cluster's id")
        if cluster in self._clusters or cluster in self._lanes:
            raise ClusterConflict(f"{origin}: cluster {cluster!r} is already watched")
        if len(self._clusters) >= self.remote.max_clusters:
            raise ClusterConflict(f"{origin}: more than PILOT_MAX_REMOTE_CLUSTERS clusters")
        wanted = Wanted.of(origin, kubeconfig)
        try:
            built = await self._build(wanted)
        except KubeconfigError as error:
            raise KubeconfigError(f"{origin}: {error}") from None
        await self._swap(cluster, wanted, built)
        self.fixed.add(cluster)

    # -- Secrets: one lane per cluster id --------------------------------------------

    def want(self, cluster: str, wanted: Wanted | None) -> None:
        """Have `cluster` watched through `wanted` (None: not watched), soon: its lane
        applies the latest state wanted, whatever other clusters are doing."""
        lane = self._lanes.get(cluster)
        if lane is not None and lane.wanted == wanted:
            return  # pending, applied, or failed already: never tried twice
        if lane is None and self._settled(cluster, wanted):
            return
        if lane is None:
            lane = self._lanes[cluster] = _Lane(wanted)
            lane.task = asyncio.create_task(
                self.run_lane(cluster, lane), name=f"remote-cluster-{cluster}"
            )
        lane.wanted = wanted
        lane.wake.set()

    def _settled(self, cluster: str, wanted: Wanted | None) -> bool:
        """True when `cluster` already is as `wanted` says (its origin is updated)."""
        current = self._clusters.get(cluster)
        if wanted is None:
            return current is None
        if current is None or current.fingerprint != wanted.fingerprint:
            return False
        current.origin = wanted.origin
        return True

    async def run_lane(self, cluster: str, lane: _Lane) -> None:
        """Forever, until `cluster` is wanted no more: apply the latest state wanted."""
        while True:
            await lane.wake.wait()
            lane.wake.clear()
            wanted = lane.wanted
            if wanted is None:
                await self._remove(cluster)
                if not lane.wake.is_set():
                    self._lanes.pop(cluster, None)
                    return
                continue
            current = self._clusters.get(cluster)
            if current is not None and current.fingerprint == wanted.fingerprint:
                current.origin = wanted.origin
                continue
            self._refused.pop(cluster, None)  # said again below if refused again
            try:
                await self._apply(cluster, lane, wanted)
            except InsecureRefused:
                self._refuse_insecure(cluster, wanted)  # the old watch, if any, goes on
            except KubeconfigError as error:
                # The cluster's old watch, if any, goes on.
                self.warn_once(wanted.origin, str(error), "kubeconfig", wanted.fingerprint)
            except Exception:  # a bug: say so, and keep the lane (and the old watch) going
                log.exception("cluster %s: applying %s failed", cluster, wanted.origin)

    def _refuse_insecure(self, cluster: str, wanted: Wanted) -> None:
        """One error line per value, counted; the status says it while unwatched."""
        self._refused[cluster] = "refused: insecure-skip-tls-verify"
        key = (wanted.origin, INSECURE_REASON, wanted.fingerprint)
        if key in self._warned:
            return
        self._warned.add(key)
        self.refusals[INSECURE_REASON] += 1
        log.error("cluster %s (%s): %s", quoted(cluster), wanted.origin, INSECURE_REFUSED)

    async def _apply(self, cluster: str, lane: _Lane, wanted: Wanted) -> None:
        """Build a client for `wanted` (within its deadline: `_build`), unless a newer state
        is wanted first; then watch through it. Raises KubeconfigError."""
        build = asyncio.create_task(self._build(wanted), name=f"remote-cluster-{cluster}-build")
        newer = asyncio.create_task(lane.wake.wait())
        try:
            done, _ = await asyncio.wait({build, newer}, return_when="FIRST_COMPLETED")
        finally:
            newer.cancel()
        if build not in done:  # superseded: the lane takes the newer state now
            build.cancel()
            (late,) = await asyncio.gather(build, return_exceptions=True)
            if isinstance(late, RemoteClient):
                await late.close()
            return
        await self._swap(cluster, wanted, build.result())

    def _too_slow(self) -> str:
        return (
            f"its client was not ready within {self.remote.start_timeout:g}s"
            " (PILOT_REMOTE_CLUSTER_START_TIMEOUT)"
        )

    async def _build(self, wanted: Wanted) -> RemoteClient:
        """A client from the kubeconfig: parsed and checked in a worker thread.

        The cluster's own steps, which its kubeconfig can make hang (a file it names,
        an allowed plugin), have PILOT_REMOTE_CLUSTER_START_TIMEOUT; its wait for its
        turn behind other clusters' clients has none: 100 clusters starting at once on
        a busy machine outlasted it in that queue, and were never watched.
        """
        if len(wanted.kubeconfig.encode()) > self.remote.max_kubeconfig_bytes:
            raise self._too_large(wanted.origin)
        allowed = self.remote.insecure_options
        try:
            async with asyncio.timeout(self.remote.start_timeout):
                credentials = await asyncio.to_thread(load_credentials, wanted.kubeconfig, allowed)
                if credentials.insecure and self.remote.refuse_insecure_skip_tls_verify:
                    raise InsecureRefused(INSECURE_REFUSED)  # before a plugin runs
                if credentials.plugin_document is not None:
                    return await plugin_api_client(credentials)
        except TimeoutError:
            raise KubeconfigError(self._too_slow()) from None
        # Building a client loads a TLS context on the loop (tens of ms with the system's
        # CAs; its own material is in memory by now): one lane at a time, a turn of the
        # loop after each, so that 100 clusters starting at once never hold up /ready or
        # a stream for long.
        async with self._building:
            built = api_client_for(credentials)
            await asyncio.sleep(0)
        return built

    def _too_large(self, origin: str) -> KubeconfigError:
        limit = self.remote.max_kubeconfig_bytes
        message = f"the kubeconfig is larger than {limit} bytes (PILOT_MAX_REMOTE_KUBECONFIG_BYTES)"
        self.hits.hit(LimitExceeded("remote_kubeconfig_bytes", message), origin)
        return KubeconfigError(message)

    async def _swap(self, cluster: str, wanted: Wanted, built: RemoteClient) -> None:
        """Watch `cluster` through `built`; the old watch's state passes to the new one."""
        old = self._clusters.get(cluster)
        registry = ClusterSource(
            self._settings,
            self._updater,
            built.api_client,
            built.server,
            cluster,
            watching=self._watching,
        )
        if old is not None:
            await old.stop()
        await registry.start(old.registry if old is not None else None)
        self._clusters[cluster] = RemoteCluster(
            cluster, wanted.origin, wanted.fingerprint, registry, built
        )
        log.info("cluster %s: %s (%s)", cluster, "replaced" if old else "added", wanted.origin)
        if built.insecure:
            log.warning(
                "cluster %s (%s): its kubeconfig has insecure-skip-tls-verify: true: the API"
                " server's certificate is not verified, so whoever is on the path to it can"
                " feed this cluster's services and endpoints (--refuse-insecure-skip-tls-verify"
                " refuses such kubeconfigs)",
                quoted(cluster),
                wanted.origin,
            )

    async def _remove(self, cluster: str) -> None:
        """Stop watching `cluster` and drop its services and endpoints."""
        self._refused.pop(cluster, None)
        remote = self._clusters.pop(cluster, None)
        if remote is None:
            return
        await remote.stop()
        self._updater.replace_cluster(cluster, [], [])
        self._updater.replace_pods(cluster, [])
        log.info("cluster %s: removed (%s)", cluster, remote.origin)
        if self._trim is None:  # once for a burst of removals
            self._trim = asyncio.get_running_loop().call_later(TRIM_AFTER, self._trim_heap)

    def _trim_heap(self) -> None:
        self._trim = None
        trim_heap()

    async def stop(self) -> None:
        """Stop every lane and watch; what they delivered stays (pilot is stopping)."""
        lanes = [lane.task for lane in self._lanes.values() if lane.task is not None]
        for task in lanes:
            task.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
        self._lanes.clear()
        if self._trim is not None:
            self._trim.cancel()
        for remote in self._clusters.values():
            await remote.stop()
        self._clusters.clear()


@dataclass(frozen=True, slots=True)
class _Secret:
    """What pilot keeps of one multi-cluster Secret."""

    name: str
    created: str  # metadata.creationTimestamp (RFC 3339, so it sorts as text)
    data: dict[str, str]  # key -> base64 value

    @property
    def order(self) -> tuple[str, str]:
        return (self.created, self.name)


class RemoteSecrets:
    """The handler of the informer on multi-cluster Secrets; `run` applies what they say.

    Upserts and deletes only record the Secrets' data and wake `run`, which works out
    who holds each cluster id and hands each id's kubeconfig to its lane (never
    waiting for one). Bad keys and values are each warned about once (naming the Secret
    and the key) and ignored.
    """

    def __init__(self, clusters: RemoteClusters, namespace: str) -> None:
        self._clusters = clusters
        self._namespace = namespace
        self._secrets: dict[str, _Secret] = {}
        self._holders: dict[str, str] = {}  # cluster id -> the Secret holding it
        self._over_limit: set[str] = set()  # origins refused by PILOT_MAX_REMOTE_CLUSTERS
        self._changed = asyncio.Event()

    # -- InformerHandler -----------------------------------------------------------

    def upsert(self, obj: Obj) -> None:
        metadata = obj.get("metadata") or {}
        name = str(metadata.get("name") or "")
        data = obj.get("data") or {}
        if not isinstance(data, dict):
            data = {}
        size = sum(len(str(k)) + len(str(v)) for k, v in data.items())
        limit = self._clusters.remote.max_secret_bytes
        if size > limit:
            # Keep what the Secret said before, so its clusters' watches go on.
            message = f"its data is {size} bytes, more than {limit} (PILOT_MAX_REMOTE_SECRET_BYTES)"
            refused = LimitExceeded("remote_secret_bytes", message)
            self._clusters.hits.hit(refused, f"Secret {self._namespace}/{name}")
            return
        created = str(metadata.get("creationTimestamp") or "")
        self._secrets[name] = _Secret(name, created, {str(k): str(v) for k, v in data.items()})
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
            self.reconcile()
            await asyncio.sleep(0)  # a burst of events is one reconcile

    def _origin(self, secret: str, key: str) -> str:
        return f"Secret {self._namespace}/{secret} key {key}"

    def reconcile(self) -> None:
        """Hand each cluster id its holder's kubeconfig; ids no Secret holds go."""
        claims = self._claims()
        for cluster in sorted(self._holders.keys() - claims.keys()):
            del self._holders[cluster]
            self._clusters.want(cluster, None)
        admitted = self._admitted(claims)
        for cluster in sorted(self._holders.keys() - admitted.keys()):
            del self._holders[cluster]
            self._clusters.want(cluster, None)
        for cluster, (secret, key) in admitted.items():
            self._holders[cluster] = secret.name
            wanted = self._wanted(secret, key)
            if wanted is not None:  # else the value is unusable: the watch it has goes on
                self._clusters.want(cluster, wanted)

    def _claims(self) -> dict[str, list[tuple[_Secret, str]]]:
        """Cluster id -> the (Secret, key) pairs naming it, the holder first, then oldest
        first. Keys that are no cluster id, or the local or a flag's id, are left out."""
        claims: dict[str, list[tuple[_Secret, str]]] = {}
        for secret in sorted(self._secrets.values(), key=lambda s: s.order):
            for key in sorted(secret.data):
                if self._usable_key(secret, key):
                    claims.setdefault(key, []).append((secret, key))
        for cluster, claimants in claims.items():
            holder = self._holders.get(cluster)
            claimants.sort(key=lambda claim: claim[0].name != holder)  # stable: holder first
            for secret, key in claimants[1:]:
                problem = f"cluster {cluster} is held by {self._origin(claimants[0][0].name, key)}"
                self._clusters.warn_once(self._origin(secret.name, key), problem, "conflict")
        return claims

    def _usable_key(self, secret: _Secret, key: str) -> bool:
        if not is_cluster_id(key):
            origin = f"Secret {self._namespace}/{secret.name} key {quoted(key)}"
            self._clusters.warn_once(origin, "the key is not a cluster id", "invalid_id")
            return False
        origin = self._origin(secret.name, key)
        if key == self._clusters.local_cluster:
            self._clusters.warn_once(origin, "it names the local cluster", "local_id")
            return False
        if key in self._clusters.fixed:
            problem = f"cluster {key} is given by --remote-kubeconfig"
            self._clusters.warn_once(origin, problem, "conflict")
            return False
        return True

    def _admitted(
        self, claims: dict[str, list[tuple[_Secret, str]]]
    ) -> dict[str, tuple[_Secret, str]]:
        """Each id's holder, as many as PILOT_MAX_REMOTE_CLUSTERS leaves room for: ids
        already held first, then the oldest claims."""
        room = max(0, self._clusters.remote.max_clusters - len(self._clusters.fixed))
        ordered = sorted(
            claims.items(),
            key=lambda item: (item[0] not in self._holders, item[1][0][0].order, item[0]),
        )
        admitted = dict((cluster, claimants[0]) for cluster, claimants in ordered[:room])
        self._refuse_over_limit([self._origin(s.name, k) for _, ((s, k), *_) in ordered[room:]])
        return admitted

    def _refuse_over_limit(self, origins: list[str]) -> None:
        """One counted line for the claims past the limit that were not refused before."""
        fresh = [origin for origin in origins if origin not in self._over_limit]
        self._over_limit = set(origins)
        if not fresh:
            return
        limit = self._clusters.remote.max_clusters
        message = (
            f"{len(fresh)} cluster ids past the first {limit} remote clusters"
            f" (PILOT_MAX_REMOTE_CLUSTERS), the first {fresh[0]}"
        )
        self._clusters.hits.hit(LimitExceeded("remote_clusters", message), "Secrets", len(fresh))

    def _wanted(self, secret: _Secret, key: str) -> Wanted | None:
        """The key's kubeconfig, or None when the value is unusable (warned once)."""
        origin, value = self._origin(secret.name, key), secret.data[key]
        limit = self._clusters.remote.max_kubeconfig_bytes
        if len(value) > (limit + 2) // 3 * 4:  # base64 of more than `limit` bytes
            problem = (
                f"the kubeconfig is larger than {limit} bytes (PILOT_MAX_REMOTE_KUBECONFIG_BYTES)"
            )
            if self._clusters.warn_once(origin, problem, "too_large", _fingerprint(value)):
                self._clusters.hits.counts["remote_kubeconfig_bytes"] += 1
            return None
        try:
            text = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            problem = "the value is not base64 of a kubeconfig"
            self._clusters.warn_once(origin, problem, "kubeconfig", _fingerprint(value))
            return None
        return Wanted.of(origin, text)


def secret_informer(
    api_client: client.ApiClient,
    namespace: str,
    handler: RemoteSecrets,
    settings: KubernetesSettings,
    faults: WatchFaults | None = None,
) -> Informer:
    """The informer on the multi-cluster Secrets of pilot's own namespace (list, watch)."""
    request = functools.partial(client.CoreV1Api(api_client).list_namespaced_secret, namespace)
    return Informer(
        "Secret", request, handler, settings.informer, MULTICLUSTER_SELECTOR, faults=faults
    )
