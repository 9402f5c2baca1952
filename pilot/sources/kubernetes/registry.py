"""The Kubernetes registry: informers whose objects feed the registry.

Services and EndpointSlices (or, with `--endpoints-api endpoints`, legacy v1
Endpoints) are watched in all namespaces or in the ones named. Each object
event becomes an upsert or delete on the `RegistryUpdater` the registry was
given. A malformed object is logged with its name and skipped; what pilot knew
of it before stays. Nodes (cluster-scoped) are watched for endpoint locality,
as metadata only (`metadata.py`), and only their region and zone labels kept.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio import client

from pilot.registry.kubernetes_objects import (
    SERVICE_NAME_LABEL,
    ObjectError,
    object_label,
    parse_endpoint_slice,
    parse_endpoints,
    parse_node,
    parse_service,
)
from pilot.registry.model import DEFAULT_CLUSTER_ID, EndpointSetKey, NodeKey, ServiceKey
from pilot.registry.updater import RegistryUpdater
from pilot.sources.kubernetes.config import EndpointsApi, KubernetesSettings
from pilot.sources.kubernetes.informer import Informer, Obj, Request
from pilot.sources.kubernetes.metadata import metadata_only

log = logging.getLogger("pilot.sources.kubernetes")


class _ServiceHandler:
    def __init__(self, updater: RegistryUpdater, cluster: str) -> None:
        self._updater = updater
        self._cluster = cluster

    def upsert(self, obj: Obj) -> None:
        try:
            service = parse_service(obj, self._cluster)
        except ObjectError as error:
            log.warning("cluster %s: ignoring %s", self._cluster, error)
            return
        self._updater.upsert(service)

    def delete(self, namespace: str, name: str) -> None:
        self._updater.delete(ServiceKey(namespace or "default", name), self._cluster)


class _EndpointsHandler:
    def __init__(self, updater: RegistryUpdater, kind: str, cluster: str) -> None:
        self._updater = updater
        self._kind = kind
        self._cluster = cluster

    def upsert(self, obj: Obj) -> None:
        try:
            parsed = (
                parse_endpoint_slice(obj, self._cluster)
                if self._kind == "EndpointSlice"
                else parse_endpoints(obj, self._cluster)
            )
        except ObjectError as error:
            log.warning("cluster %s: ignoring %s", self._cluster, error)
            return
        if parsed is None:  # an FQDN slice: nothing EDS can carry
            meta = obj.get("metadata") or {}
            self.delete(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
            log.debug("skipping %s (not an IP address type)", object_label(obj))
            return
        self._updater.upsert(parsed)

    def delete(self, namespace: str, name: str) -> None:
        key = EndpointSetKey(self._kind, namespace or "default", name, self._cluster)
        self._updater.delete(key)


class _NodeHandler:
    def __init__(self, updater: RegistryUpdater, cluster: str) -> None:
        self._updater = updater
        self._cluster = cluster

    def upsert(self, obj: Obj) -> None:
        try:
            node = parse_node(obj, self._cluster)
        except ObjectError as error:
            log.warning("cluster %s: ignoring %s", self._cluster, error)
            return
        self._updater.upsert(node)

    def delete(self, namespace: str, name: str) -> None:
        self._updater.delete(NodeKey(self._cluster, name))


def _requests(
    api_client: client.ApiClient, namespace: str | None, api: EndpointsApi
) -> dict[str, Request]:
    core, discovery = client.CoreV1Api(api_client), client.DiscoveryV1Api(api_client)
    if namespace is None:
        services: Request = core.list_service_for_all_namespaces
        slices: Request = discovery.list_endpoint_slice_for_all_namespaces
        endpoints: Request = core.list_endpoints_for_all_namespaces
    else:
        services = functools.partial(core.list_namespaced_service, namespace)
        slices = functools.partial(discovery.list_namespaced_endpoint_slice, namespace)
        endpoints = functools.partial(core.list_namespaced_endpoints, namespace)
    if api is EndpointsApi.ENDPOINTS:
        return {"Service": services, "Endpoints": endpoints}
    return {"Service": services, "EndpointSlice": slices}


class KubernetesRegistry:
    """Runs the informers; `synced` once every one of them has listed."""

    def __init__(
        self,
        settings: KubernetesSettings,
        updater: RegistryUpdater,
        api_client: client.ApiClient,
        server: str,
        cluster: str = DEFAULT_CLUSTER_ID,
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self._updater = updater
        self._api_client = api_client
        self.server = server
        self.informers: list[Informer] = []
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def synced(self) -> bool:
        return bool(self.informers) and all(i.synced.is_set() for i in self.informers)

    def _build_informers(self, api_client: client.ApiClient) -> list[Informer]:
        namespaces: Sequence[str | None] = self.settings.namespaces or (None,)
        informers = []
        for namespace in namespaces:
            for kind, request in _requests(
                api_client, namespace, self.settings.endpoints_api
            ).items():
                if kind == "Service":
                    handler: Any = _ServiceHandler(self._updater, self.cluster)
                else:
                    handler = _EndpointsHandler(self._updater, kind, self.cluster)
                selector = SERVICE_NAME_LABEL if kind == "EndpointSlice" else ""
                informers.append(Informer(kind, request, handler, self.settings.informer, selector))
        nodes = _NodeHandler(self._updater, self.cluster)
        list_nodes = metadata_only(api_client, "/api/v1/nodes")
        informers.append(Informer("Node", list_nodes, nodes, self.settings.informer))
        return informers

    async def start(self, previous: KubernetesRegistry | None = None) -> None:
        """Start watching; in place of `previous` (the same cluster, reached anew) if given:
        what it delivered stays until the first lists say what is gone."""
        self.informers = self._build_informers(self._api_client)
        if previous is not None:  # same settings, so the same informers in the same order
            for informer, old in zip(self.informers, previous.informers, strict=True):
                informer.inherit(old)
        self._tasks = [
            asyncio.create_task(informer.run(), name=f"informer-{self.cluster}-{informer.kind}")
            for informer in self.informers
        ]
        scope = ", ".join(self.settings.namespaces) or "all namespaces"
        log.info(
            "cluster %s: watching %s in %s on %s",
            self.cluster,
            " and ".join(sorted({i.kind for i in self.informers})),
            scope,
            self.server,
        )

    async def wait_synced(self) -> None:
        await asyncio.gather(*(informer.synced.wait() for informer in self.informers))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
