"""Resource types the test API server knows: kind, plural, group/version, scope.

Owns the registry of served resources, their URL coordinates and the API
discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ResourceType:
    """One served resource (e.g. core/v1 services)."""

    kind: str
    plural: str
    group: str
    version: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def base_path(self) -> str:
        if self.group:
            return f"/apis/{self.group}/{self.version}"
        return f"/api/{self.version}"

    def discovery_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        return entry


RESOURCE_TYPES: tuple[ResourceType, ...] = (
    ResourceType("Namespace", "namespaces", "", "v1", namespaced=False, short_names=("ns",)),
    ResourceType("Service", "services", "", "v1", short_names=("svc",)),
    ResourceType("Endpoints", "endpoints", "", "v1", short_names=("ep",)),
    ResourceType("Secret", "secrets", "", "v1"),
    ResourceType("ConfigMap", "configmaps", "", "v1", short_names=("cm",)),
    ResourceType("Pod", "pods", "", "v1", short_names=("po",)),
    ResourceType("Node", "nodes", "", "v1", namespaced=False, short_names=("no",)),
    ResourceType("EndpointSlice", "endpointslices", "discovery.k8s.io", "v1"),
    ResourceType("Lease", "leases", "coordination.k8s.io", "v1"),
    # Istio's custom resource, in both versions Istio serves (v1 preferred).
    ResourceType("PeerAuthentication", "peerauthentications", "security.istio.io", "v1"),
    ResourceType("PeerAuthentication", "peerauthentications", "security.istio.io", "v1beta1"),
    ResourceType("AuthorizationPolicy", "authorizationpolicies", "security.istio.io", "v1"),
    ResourceType("AuthorizationPolicy", "authorizationpolicies", "security.istio.io", "v1beta1"),
    ResourceType("RequestAuthentication", "requestauthentications", "security.istio.io", "v1"),
    ResourceType("RequestAuthentication", "requestauthentications", "security.istio.io", "v1beta1"),
)

_BY_NAME: dict[str, ResourceType] = {}
for _rt in RESOURCE_TYPES:
    for _name in (_rt.kind, _rt.plural, *_rt.short_names):
        _BY_NAME.setdefault(_name.lower(), _rt)  # a kind in two versions: the first


def resource_type(kind_or_plural: str) -> ResourceType:
    """Look a resource type up by kind ("Service"), plural ("services") or short name."""
    try:
        return _BY_NAME[kind_or_plural.lower()]
    except KeyError:
        raise KeyError(f"unknown resource kind {kind_or_plural!r}") from None


def resource_at(group: str, version: str, plural: str) -> ResourceType | None:
    """The resource served under /api(s)/<group>/<version>/<plural>, if any."""
    for rt in RESOURCE_TYPES:
        if (rt.group, rt.version, rt.plural) == (group, version, plural):
            return rt
    return None


def group_versions() -> list[tuple[str, str]]:
    """Every (group, version) served, core ("") first."""
    seen: list[tuple[str, str]] = []
    for rt in RESOURCE_TYPES:
        if (rt.group, rt.version) not in seen:
            seen.append((rt.group, rt.version))
    return seen


def api_versions_doc(server_address: str) -> dict[str, Any]:
    """`GET /api`."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group_entry(group: str) -> dict[str, Any]:
    """A group with every version it is served in, the first preferred."""
    versions = [
        {"groupVersion": f"{group}/{version}", "version": version}
        for served, version in group_versions()
        if served == group
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def api_group_list_doc() -> dict[str, Any]:
    """`GET /apis`: every non-core group."""
    groups = list(dict.fromkeys(group for group, _ in group_versions() if group))
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_entry(group) for group in groups],
    }


def api_group_doc(group: str) -> dict[str, Any] | None:
    """`GET /apis/<group>`; None when not served."""
    if not group or all(served != group for served, _ in group_versions()):
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group)}


def api_resource_list_doc(group: str, version: str) -> dict[str, Any] | None:
    """`GET /api/v1` or `GET /apis/<group>/<version>`; None when not served."""
    served = [rt for rt in RESOURCE_TYPES if (rt.group, rt.version) == (group, version)]
    if not served:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": [rt.discovery_entry() for rt in served],
    }


VERSION_DOC: dict[str, Any] = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-04-23T00:00:00Z",
    "goVersion": "go1.24.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}
