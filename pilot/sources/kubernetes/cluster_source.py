"""A cluster as a source: its informers, whose objects feed the registry.

Services and EndpointSlices (or, with `--endpoints-api endpoints`, legacy v1
Endpoints) are watched in all namespaces or in the ones named. Each object
event becomes an upsert or delete on the `RegistryUpdater` the registry was
given. A malformed object is logged with its name (rate-limited,
`WatchFaults`), counted and skipped (reason `missing_field` when it lacks a field
Kubernetes requires, such as a Service's `spec.ports`, else `invalid`); what pilot
knew of it before stays:
whatever a parser raises on it (a wrong type, nesting deep enough for
RecursionError) never ends the informer. Nodes (cluster-scoped) are watched for
endpoint locality, as metadata only (`metadata.py`), and only their region and
zone labels kept. Pods (auto mTLS: which endpoints run a sidecar, under which
service account) are watched in the same namespaces as Services, without the
ones that are done (a field selector on `status.phase`: completed Jobs' pods
are most pods of many clusters), and only their IPs, service account, labels
(tlsMode; workload selectors of PeerAuthentication), phase and container ports
kept. The local cluster's registry (`peer_authentications=True`) also watches
Istio's PeerAuthentication (`peer_authentications.py`), in the same namespaces
and the root namespace. Each informer runs as a task of the supervisor it is
given (`Watching`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio import client

from pilot.kube.config import EndpointsApi, KubernetesSettings
from pilot.kube.informer import Informer, Obj, Request, WatchFaults, Watching
from pilot.kube.metadata import metadata_only
from pilot.registry.authorization_policy import KIND as AUTHORIZATION_POLICY
from pilot.registry.kubernetes_objects import (
    SERVICE_NAME_LABEL,
    MissingField,
    ObjectError,
    object_label,
    parse_endpoint_slice,
    parse_endpoints,
    parse_node,
    parse_pod,
    parse_service,
)
from pilot.registry.model import DEFAULT_CLUSTER_ID, EndpointSetKey, NodeKey, PodKey, ServiceKey
from pilot.registry.peer_authentication import KIND as PEER_AUTHENTICATION
from pilot.registry.peer_authentication import ROOT_NAMESPACE
from pilot.registry.request_authentication import KIND as REQUEST_AUTHENTICATION
from pilot.registry.updater import RegistryUpdater
from pilot.runtime.supervisor import SupervisedTask, describe
from pilot.sources.kubernetes.authorization_policies import PLURAL as AUTHZ_PLURAL
from pilot.sources.kubernetes.authorization_policies import AuthorizationPolicyHandler
from pilot.sources.kubernetes.istio_config import (
    KINDS,
    TrafficHandler,
    UnsupportedHandler,
    config_path_of,
    request_for,
    served_versions,
)
from pilot.sources.kubernetes.peer_authentications import (
    PeerAuthenticationHandler,
    objects_at,
    path_of,
    served_version,
)
from pilot.sources.kubernetes.request_authentications import PLURAL as JWT_PLURAL
from pilot.sources.kubernetes.request_authentications import RequestAuthenticationHandler

log = logging.getLogger("pilot.sources.kubernetes")

# What the parsers may raise on objects no API server would send (a port name nested
# 900 deep, an addressType that is a list): the object is malformed, never a crash.
_PARSE_ERRORS = (ObjectError, TypeError, ValueError, KeyError, AttributeError, RecursionError)


class _Handler:
    """Parses each object; one that does not parse is counted and logged (rate-limited)
    as `missing_field` or `invalid`, and what pilot knew of it before stays."""

    def __init__(
        self, updater: RegistryUpdater, kind: str, cluster: str, faults: WatchFaults
    ) -> None:
        self._updater = updater
        self._kind = kind
        self._cluster = cluster
        self._faults = faults

    def _report(self, obj: Obj, error: Exception) -> None:
        what = str(error) if isinstance(error, ObjectError) else describe(error)
        if not isinstance(error, ObjectError):
            what = f"{object_label(obj)}: {what}"
        reason = "missing_field" if isinstance(error, MissingField) else "invalid"
        self._faults.report(self._cluster, self._kind, reason, f"an invalid {what}")


class _ServiceHandler(_Handler):
    def upsert(self, obj: Obj) -> None:
        try:
            service = parse_service(obj, self._cluster)
        except _PARSE_ERRORS as error:
            self._report(obj, error)
            return
        self._updater.upsert_service(service)

    def delete(self, namespace: str, name: str) -> None:
        self._updater.delete_service(ServiceKey(namespace or "default", name), self._cluster)


class _EndpointsHandler(_Handler):
    def upsert(self, obj: Obj) -> None:
        try:
            parsed = (
                parse_endpoint_slice(obj, self._cluster)
                if self._kind == "EndpointSlice"
                else parse_endpoints(obj, self._cluster)
            )
        except _PARSE_ERRORS as error:
            self._report(obj, error)
            return
        if parsed is None:  # an FQDN slice: nothing EDS can carry
            meta = obj.get("metadata") or {}
            self.delete(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
            log.debug("skipping %s (not an IP address type)", object_label(obj))
            return
        self._updater.upsert_endpoints(parsed)

    def delete(self, namespace: str, name: str) -> None:
        key = EndpointSetKey(self._kind, namespace or "default", name, self._cluster)
        self._updater.delete_endpoints(key)


class _NodeHandler(_Handler):
    def upsert(self, obj: Obj) -> None:
        try:
            node = parse_node(obj, self._cluster)
        except _PARSE_ERRORS as error:
            self._report(obj, error)
            return
        self._updater.upsert_node(node)

    def delete(self, namespace: str, name: str) -> None:
        self._updater.delete_node(NodeKey(self._cluster, name))


class _PodHandler(_Handler):
    def upsert(self, obj: Obj) -> None:
        try:
            pod = parse_pod(obj, self._cluster)
        except _PARSE_ERRORS as error:
            self._report(obj, error)
            return
        self._updater.upsert_pod(pod)

    def delete(self, namespace: str, name: str) -> None:
        self._updater.delete_pod(PodKey(self._cluster, namespace or "default", name))


# Pods that are done are no endpoint's: the API server leaves them out (and tells a
# watch a pod that finishes is DELETED from its view).
POD_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"


def _pod_request(api_client: client.ApiClient, namespace: str | None) -> Request:
    core = client.CoreV1Api(api_client)
    request: Request = (
        core.list_pod_for_all_namespaces
        if namespace is None
        else functools.partial(core.list_namespaced_pod, namespace)
    )
    return functools.partial(request, field_selector=POD_FIELD_SELECTOR)


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


class ClusterSource:
    """Runs the informers, each a task under the supervisor named
    `informer-CLUSTER-KIND`; `synced` once every one of them has listed."""

    def __init__(
        self,
        settings: KubernetesSettings,
        updater: RegistryUpdater,
        api_client: client.ApiClient,
        server: str,
        cluster: str = DEFAULT_CLUSTER_ID,
        *,
        watching: Watching | None = None,
        peer_authentications: bool = False,
        cluster_domain: str = "cluster.local",
    ) -> None:
        self.settings = settings
        self._peer_authentications = peer_authentications  # and Istio's other config
        self._cluster_domain = cluster_domain
        self.cluster = cluster
        self._updater = updater
        self._api_client = api_client
        self.server = server
        self._watching = watching if watching is not None else Watching()
        self.informers: list[Informer] = []
        self._tasks: list[SupervisedTask] = []

    @property
    def synced(self) -> bool:
        """Every informer has listed once: what readiness waits for, as Istio's does.
        Whether each is still in sync is its own `synced` (and `error`)."""
        return bool(self.informers) and all(i.listed.is_set() for i in self.informers)

    def _build_informers(self, api_client: client.ApiClient) -> list[Informer]:
        namespaces: Sequence[str | None] = self.settings.namespaces or (None,)
        faults = self._watching.faults
        informers = []
        for namespace in namespaces:
            for kind, request in _requests(
                api_client, namespace, self.settings.endpoints_api
            ).items():
                if kind == "Service":
                    handler: Any = _ServiceHandler(self._updater, kind, self.cluster, faults)
                else:
                    handler = _EndpointsHandler(self._updater, kind, self.cluster, faults)
                selector = SERVICE_NAME_LABEL if kind == "EndpointSlice" else ""
                informers.append(self._informer(kind, request, handler, selector))
            pods = _PodHandler(self._updater, "Pod", self.cluster, faults)
            informers.append(self._informer("Pod", _pod_request(api_client, namespace), pods))
        nodes = _NodeHandler(self._updater, "Node", self.cluster, faults)
        list_nodes = metadata_only(api_client, "/api/v1/nodes")
        informers.append(self._informer("Node", list_nodes, nodes))
        return informers

    def _informer(self, kind: str, request: Request, handler: Any, selector: str = "") -> Informer:
        return Informer(
            kind,
            request,
            handler,
            self.settings.informer,
            selector,
            cluster=self.cluster,
            faults=self._watching.faults,
            refusals=self._watching.refusals,
        )

    async def start(self, previous: ClusterSource | None = None) -> None:
        """Start watching; in place of `previous` (the same cluster, reached anew) if given:
        what it delivered stays until the first lists say what is gone."""
        self.informers = self._build_informers(self._api_client)
        if self._peer_authentications:
            self.informers += await self._policy_informers()
            self.informers += await self._istio_config_informers()
        if previous is not None:  # same settings, so the same informers in the same order
            for informer, old in zip(self.informers, previous.informers, strict=True):
                informer.inherit(old)
        supervisor = self._watching.supervisor
        self._tasks = [
            supervisor.start(f"informer-{self.cluster}-{informer.kind}", informer.run)
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

    async def _policy_informers(self) -> list[Informer]:
        """PeerAuthentication informers, in the watched namespaces and the root one."""
        version = await served_version(self._api_client)
        if version is None:
            log.warning(
                "cluster %s: the API server serves no %s (Istio's CRDs are not installed):"
                " every namespace's sidecars are PERMISSIVE",
                self.cluster,
                PEER_AUTHENTICATION,
            )
            return []
        handler = PeerAuthenticationHandler(self._updater, self.cluster, self._watching.faults)
        informers = [
            self._informer(
                PEER_AUTHENTICATION, objects_at(self._api_client, path_of(version, ns)), handler
            )
            for ns in self._policy_namespaces()
        ]
        return informers + await self._authz_informers() + await self._jwt_informers()

    def _policy_namespaces(self) -> list[str | None]:
        """The watched namespaces (None: all), and the root one, whose policies are mesh's."""
        namespaces: list[str | None] = list(self.settings.namespaces) or [None]
        if None not in namespaces and ROOT_NAMESPACE not in namespaces:
            namespaces.append(ROOT_NAMESPACE)
        return namespaces

    async def _authz_informers(self) -> list[Informer]:
        """AuthorizationPolicy informers, in the same namespaces."""
        version = await served_version(self._api_client, AUTHZ_PLURAL)
        if version is None:
            log.warning(
                "cluster %s: the API server serves no %s (Istio's CRDs are not installed):"
                " there are none to enforce",
                self.cluster,
                AUTHORIZATION_POLICY,
            )
            return []
        handler = AuthorizationPolicyHandler(self._updater, self.cluster, self._watching.faults)
        return [
            self._informer(
                AUTHORIZATION_POLICY,
                objects_at(self._api_client, path_of(version, ns, AUTHZ_PLURAL)),
                handler,
            )
            for ns in self._policy_namespaces()
        ]

    async def _jwt_informers(self) -> list[Informer]:
        """RequestAuthentication informers, in the same namespaces."""
        version = await served_version(self._api_client, JWT_PLURAL)
        if version is None:
            log.warning(
                "cluster %s: the API server serves no %s (Istio's CRDs are not installed):"
                " there are none to enforce",
                self.cluster,
                REQUEST_AUTHENTICATION,
            )
            return []
        handler = RequestAuthenticationHandler(self._updater, self.cluster, self._watching.faults)
        return [
            self._informer(
                REQUEST_AUTHENTICATION,
                objects_at(self._api_client, path_of(version, ns, JWT_PLURAL)),
                handler,
            )
            for ns in self._policy_namespaces()
        ]

    async def _istio_config_informers(self) -> list[Informer]:
        """DestinationRule, VirtualService and the unsupported kinds' informers, for each
        kind the API server serves (one warning for those it does not)."""
        served = await served_versions(self._api_client)
        missing = sorted(k.kind for k in KINDS if k not in served)
        if missing:
            log.warning(
                "cluster %s: the API server serves no %s (Istio's CRDs are not installed?)",
                self.cluster,
                ", ".join(missing),
            )
        namespaces: list[str | None] = list(self.settings.namespaces) or [None]
        faults = self._watching.faults
        informers = []
        for kind, version in served.items():
            handler: Any = (
                TrafficHandler(kind.kind, self._updater, self.cluster, faults, self._cluster_domain)
                if kind.whole
                else UnsupportedHandler(kind.kind, self._updater)
            )
            for ns in namespaces:
                request = request_for(self._api_client, kind, config_path_of(kind, version, ns))
                informers.append(self._informer(kind.kind, request, handler))
        return informers

    async def wait_synced(self) -> None:
        await asyncio.gather(*(informer.listed.wait() for informer in self.informers))

    async def stop(self) -> None:
        for task in self._tasks:
            await self._watching.supervisor.stop_task(task)
        self._watching.faults.forget(self.cluster)
        self._watching.refusals.forget(self.cluster)
