"""The trust root where workloads find it: ConfigMap `istio-ca-root-cert` in each namespace.

As Istio's namespace controller does, pilot keeps the ConfigMap
`istio-ca-root-cert` (data key `root-cert.pem`) in every namespace it watches:
those named by `--namespaces`, or else every namespace (Namespace objects,
watched as metadata only) but Kubernetes' own, which Istio leaves alone too.
Its data is pilot's root (what proxies get as `ROOTCA`) and nothing else,
never a key. pilot creates it where it is missing, puts it back when someone
deletes it or changes its data, and rewrites it when the root changes
(`root_changed`).

Every replica watches (the ConfigMaps by name, which RBAC can limit reading
to); only the holder of the Lease `pilot-ca` writes, and only what differs
from the wanted state, so writes are idempotent and replicas never fight. A
write that lost a race (409: created or changed meanwhile) is not retried: the
watch brings the newer state, which is looked at again. Other failures are
retried with backoff, per namespace.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any, cast

from kubernetes_asyncio import client

from pilot.kube.api_client import CONNECTION_FAILED
from pilot.kube.config import KubernetesSettings
from pilot.kube.informer import Informer, Obj, Request
from pilot.kube.metadata import metadata_only
from pilot.runtime.backoff import Backoff
from pilot.runtime.supervisor import Supervisor
from pilot.security.lease import CONFLICT, NOT_FOUND, LeaseElector

log = logging.getLogger("pilot.security.ca")

CONFIGMAP = "istio-ca-root-cert"
ROOT_KEY = "root-cert.pem"
LABELS = {"istio.io/config": "true"}  # Istio's label on it
SYSTEM_NAMESPACES = frozenset(
    {"kube-system", "kube-public", "kube-node-lease", "local-path-storage"}
)
BY_NAME = f"metadata.name={CONFIGMAP}"


def namespace_metadata(api_client: client.ApiClient) -> Request:
    """List or watch Namespaces as metadata only."""
    return metadata_only(api_client, "/api/v1/namespaces")


class _Namespaces:
    """The namespaces to publish in, when watching all of them (an informer's handler)."""

    def __init__(self, changed: Callable[[str], None]) -> None:
        self.names: set[str] = set()
        self._changed = changed

    def upsert(self, obj: Obj) -> None:
        metadata = obj.get("metadata") or {}
        name = str(metadata.get("name") or "")
        if not name or name in SYSTEM_NAMESPACES:
            return
        if metadata.get("deletionTimestamp"):  # terminating: nothing can be created there
            self.names.discard(name)
        elif name not in self.names:
            self.names.add(name)
            self._changed(name)

    def delete(self, namespace: str, name: str) -> None:
        self.names.discard(name)


class _ConfigMaps:
    """The ConfigMaps named istio-ca-root-cert, by namespace (an informer's handler)."""

    def __init__(self, changed: Callable[[str], None]) -> None:
        self.by_namespace: dict[str, Obj] = {}
        self._changed = changed

    def upsert(self, obj: Obj) -> None:
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        self.by_namespace[namespace] = obj
        self._changed(namespace)

    def delete(self, namespace: str, name: str) -> None:
        self.by_namespace.pop(namespace, None)
        self._changed(namespace)


def _up_to_date(current: Obj, root_pem: str) -> bool:
    labels = (current.get("metadata") or {}).get("labels") or {}
    return (
        current.get("data") == {ROOT_KEY: root_pem}
        and not current.get("binaryData")
        and LABELS.items() <= labels.items()
    )


def _new(namespace: str, root_pem: str) -> Obj:
    metadata = {"name": CONFIGMAP, "namespace": namespace, "labels": dict(LABELS)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {ROOT_KEY: root_pem},
    }


def _restored(current: Obj, root_pem: str) -> Obj:
    """`current` with pilot's data and label back; its resourceVersion guards the write."""
    metadata = dict(current.get("metadata") or {})
    metadata["labels"] = {**(metadata.get("labels") or {}), **LABELS}
    body = {k: v for k, v in current.items() if k != "binaryData"}
    return body | {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {ROOT_KEY: root_pem},
    }


class RootPublisher:
    """Keeps istio-ca-root-cert right in every watched namespace; `run` until cancelled."""

    def __init__(
        self,
        api_client: client.ApiClient,
        kubernetes: KubernetesSettings,
        root_pem: Callable[[], str],
        elector: LeaseElector,
        *,
        retry_max: float = 30.0,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._api = client.CoreV1Api(api_client)
        self._named = frozenset(kubernetes.namespaces)
        self._root_pem = root_pem
        self._elector = elector
        self._retry_max = retry_max
        self._supervisor = supervisor if supervisor is not None else Supervisor()
        self._api_client, self._kubernetes = api_client, kubernetes
        self._configmaps = _ConfigMaps(self._mark)
        self._namespaces = _Namespaces(self._mark)
        self.informers = self._informers(api_client, kubernetes)
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._backoffs: dict[str, Backoff] = {}
        elector.on_change(lambda leading: self.root_changed() if leading else None)

    def _informers(
        self, api_client: client.ApiClient, kubernetes: KubernetesSettings
    ) -> list[Informer]:
        core, settings = client.CoreV1Api(api_client), kubernetes.informer
        if self._named:
            return [
                Informer(
                    "ConfigMap",
                    functools.partial(
                        core.list_namespaced_config_map, name, field_selector=BY_NAME
                    ),
                    self._configmaps,
                    settings,
                )
                for name in sorted(self._named)
            ]
        everywhere = functools.partial(
            core.list_config_map_for_all_namespaces, field_selector=BY_NAME
        )
        return [
            Informer("ConfigMap", everywhere, self._configmaps, settings),
            Informer("Namespace", namespace_metadata(api_client), self._namespaces, settings),
        ]

    def _wanted(self) -> Iterable[str]:
        return self._named or self._namespaces.names

    def root_changed(self) -> None:
        """Look at every namespace again (the root changed, or this replica now writes)."""
        for namespace in self._wanted():
            self._mark(namespace)

    def _mark(self, namespace: str) -> None:
        self._dirty.add(namespace)
        self._wake.set()

    async def run(self) -> None:
        """Watch (each informer a task of the supervisor, `root-KIND`); while holding the
        Lease, write what differs."""
        # Started again after a failure: what the failed run saw is not to be trusted
        # (it may be what made it fail), so watch afresh and act on the new lists only.
        self._configmaps = _ConfigMaps(self._mark)
        self._namespaces = _Namespaces(self._mark)
        self.informers = self._informers(self._api_client, self._kubernetes)
        tasks = [self._supervisor.start(f"root-{i.kind}", i.run) for i in self.informers]
        try:
            await asyncio.gather(*(informer.listed.wait() for informer in self.informers))
            self.root_changed()
            await self._work()
        finally:
            for task in tasks:
                await self._supervisor.stop_task(task)

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._dirty = self._dirty, set()
            if self._elector.is_leader:
                for namespace in sorted(batch):
                    await self._reconcile(namespace)

    async def _reconcile(self, namespace: str) -> None:
        current = self._configmaps.by_namespace.get(namespace)
        root_pem = self._root_pem()
        if namespace not in self._wanted() or (current and _up_to_date(current, root_pem)):
            self._backoffs.pop(namespace, None)
            return
        try:
            await self._write(namespace, current, root_pem)
        except client.ApiException as error:
            if error.status == CONFLICT or (error.status == NOT_FOUND and current is not None):
                return  # created, changed or deleted meanwhile: the watch brings it, we look again
            self._retry(namespace, f"{error.status} {error.reason}")
        except CONNECTION_FAILED as error:
            self._retry(namespace, str(error) or type(error).__name__)
        else:
            self._backoffs.pop(namespace, None)

    async def _write(self, namespace: str, current: Obj | None, root_pem: str) -> None:
        """Create, or replace from what the watch saw (its resourceVersion guards the write).

        Raw bodies (the client sends a dict as it is): a replace keeps every field pilot
        does not own (annotations, owners...) as the API server has it.
        """
        if current is None:
            body = _new(namespace, root_pem)
            await self._api.create_namespaced_config_map(namespace, cast(Any, body))
            log.info("created ConfigMap %s/%s with pilot's root", namespace, CONFIGMAP)
        else:
            body = _restored(current, root_pem)
            await self._api.replace_namespaced_config_map(CONFIGMAP, namespace, cast(Any, body))
            log.info("put pilot's root back in ConfigMap %s/%s", namespace, CONFIGMAP)

    def _retry(self, namespace: str, reason: str) -> None:
        backoff = self._backoffs.setdefault(namespace, Backoff(0.5, self._retry_max))
        delay = backoff.next_delay()
        log.warning(
            "cannot write ConfigMap %s/%s: %s; retrying in %.1fs",
            namespace,
            CONFIGMAP,
            reason,
            delay,
        )
        asyncio.get_running_loop().call_later(delay, self._mark, namespace)
