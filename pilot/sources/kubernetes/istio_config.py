"""Istio's traffic objects from the local cluster: DestinationRule and VirtualService read
whole, the kinds pilot does not implement by their metadata only (to count and list).

Istio reads its configuration from the config cluster only, so only the local
cluster's registry watches these (as PeerAuthentication, `peer_authentications.py`).
For each kind the API server is asked which version of its group it serves (the
first of Istio's versions whose discovery lists the resource); a kind it serves
none of (Istio's CRDs are not installed) is said once in one line and not watched:
pilot is ready without it, and installing the CRDs later takes a restart.

An object that does not parse is one warning naming it (kind, namespace, name, the
field), counted (`pilot_config_rejected_total{kind}`, and as `invalid` in the
watch faults), and skipped: the last good version pilot holds of it keeps serving.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

from pilot.kube.informer import Obj, Request, WatchFaults
from pilot.kube.metadata import metadata_only, raw_request
from pilot.registry.destination_rule import KIND as DESTINATION_RULE
from pilot.registry.destination_rule import parse_destination_rule
from pilot.registry.istio_config import ConfigError, ConfigKey, key_of
from pilot.registry.traffic_config import Config
from pilot.registry.updater import RegistryUpdater
from pilot.registry.virtual_service import KIND as VIRTUAL_SERVICE
from pilot.registry.virtual_service import parse_virtual_service
from pilot.runtime.supervisor import describe

log = logging.getLogger("pilot.sources.kubernetes")

_DISCOVERY_BYTES = 1 << 20
_PARSE_ERRORS = (ConfigError, TypeError, ValueError, KeyError, AttributeError, RecursionError)
_NETWORKING = ("networking.istio.io", ("v1", "v1beta1", "v1alpha3"))
_TELEMETRY = ("telemetry.istio.io", ("v1", "v1alpha1"))
_EXTENSIONS = ("extensions.istio.io", ("v1alpha1",))
_NETWORKING_ALPHA = ("networking.istio.io", ("v1beta1", "v1alpha3"))


@dataclass(frozen=True)
class IstioKind:
    kind: str
    plural: str
    group: str
    versions: tuple[str, ...]
    whole: bool = False  # read whole (and parsed), else metadata only


KINDS = (
    IstioKind(DESTINATION_RULE, "destinationrules", *_NETWORKING, whole=True),
    IstioKind(VIRTUAL_SERVICE, "virtualservices", *_NETWORKING, whole=True),
    IstioKind("Gateway", "gateways", *_NETWORKING),
    IstioKind("ServiceEntry", "serviceentries", *_NETWORKING),
    IstioKind("Sidecar", "sidecars", *_NETWORKING),
    IstioKind("WorkloadEntry", "workloadentries", *_NETWORKING),
    IstioKind("WorkloadGroup", "workloadgroups", *_NETWORKING),
    IstioKind("EnvoyFilter", "envoyfilters", *_NETWORKING_ALPHA),
    IstioKind("ProxyConfig", "proxyconfigs", "networking.istio.io", ("v1beta1",)),
    IstioKind("Telemetry", "telemetries", *_TELEMETRY),
    IstioKind("WasmPlugin", "wasmplugins", *_EXTENSIONS),
)


def config_path_of(kind: IstioKind, version: str, namespace: str | None) -> str:
    base = f"/apis/{kind.group}/{version}"
    if namespace is None:
        return f"{base}/{kind.plural}"
    return f"{base}/namespaces/{namespace}/{kind.plural}"


def request_for(api_client: client.ApiClient, kind: IstioKind, path: str) -> Request:
    if kind.whole:
        return raw_request(api_client, path, lambda _watching: "application/json")
    return metadata_only(api_client, path)


async def _discovery(api_client: client.ApiClient, group_version: str) -> tuple[int, bytes]:
    response = await api_client.call_api(
        f"/apis/{group_version}",
        "GET",
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=30,
    )
    async with response:
        return response.status, await response.content.read(_DISCOVERY_BYTES)


class _Discovery:
    """The API server's discovery documents, each asked once; after one failure to ask,
    no more (a hung API server delays the start by one request timeout, not one per
    group version)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._api_client = api_client
        self._answers: dict[str, tuple[int, bytes] | None] = {}
        self._unreachable = False

    async def answer(self, group_version: str) -> tuple[int, bytes] | None:
        """Its status and body; None when it could not be asked."""
        if group_version not in self._answers:
            self._answers[group_version] = (
                None if self._unreachable else await self._ask(group_version)
            )
        return self._answers[group_version]

    async def _ask(self, group_version: str) -> tuple[int, bytes] | None:
        try:
            return await _discovery(self._api_client, group_version)
        except Exception as error:  # unreachable: the informers will retry
            log.warning("could not ask which %s is served: %s", group_version, describe(error))
            self._unreachable = True
            return None


async def served_versions(api_client: client.ApiClient) -> dict[IstioKind, str]:
    """Each kind the API server serves, with the version to watch it at. Where the
    server could not be asked, a kind read whole is watched at its first version anyway
    (the informer retries, holding readiness back: a rule is never dropped because the
    API server was slow at start); a metadata-only one is left out."""
    discovery = _Discovery(api_client)
    found: dict[IstioKind, str] = {}
    for kind in KINDS:
        for version in kind.versions:
            answer = await discovery.answer(f"{kind.group}/{version}")
            if answer is None or (not 200 <= answer[0] < 300 and answer[0] != 404):
                if kind.whole:
                    found[kind] = kind.versions[0]
                break
            if answer[0] != 404 and f'"{kind.plural}"'.encode() in answer[1]:
                found[kind] = version
                break
    return found


class TrafficHandler:
    """Parses each DestinationRule or VirtualService into the updater; a bad one is
    warned about, counted and skipped (its last good version stays)."""

    def __init__(
        self,
        kind: str,
        updater: RegistryUpdater,
        cluster: str,
        faults: WatchFaults,
        cluster_domain: str,
    ) -> None:
        self._kind = kind
        self._parse = parse_destination_rule if kind == DESTINATION_RULE else parse_virtual_service
        self._updater = updater
        self._cluster = cluster
        self._faults = faults
        self._domain = cluster_domain

    def upsert(self, obj: Obj) -> None:
        try:
            config: Config = self._parse(obj, self._domain)
        except _PARSE_ERRORS as error:
            key = key_of(self._kind, obj)
            what = str(error) if isinstance(error, ConfigError) else f"{key}: {describe(error)}"
            log.warning(
                "cluster %s: %s; its last good version (if any) keeps serving", self._cluster, what
            )
            self._updater.config_refused(key)
            self._faults.report(self._cluster, self._kind, "invalid", f"an invalid {what}")
            return
        self._updater.upsert_config(config)

    def delete(self, namespace: str, name: str) -> None:
        self._updater.delete_config(ConfigKey(self._kind, namespace or "default", name))


class UnsupportedHandler:
    """Notes each object of a kind pilot does not implement (by its metadata)."""

    def __init__(self, kind: str, updater: RegistryUpdater) -> None:
        self._kind = kind
        self._updater = updater

    def upsert(self, obj: Obj) -> None:
        meta: Mapping[str, Any] = obj.get("metadata") or {}
        if isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
            self._updater.upsert_unsupported(key_of(self._kind, {"metadata": meta}))

    def delete(self, namespace: str, name: str) -> None:
        self._updater.delete_config(ConfigKey(self._kind, namespace or "default", name))
