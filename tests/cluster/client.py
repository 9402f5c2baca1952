"""A test's own requests to the real API server: create, apply, patch, delete, tokens.

Plain REST over aiohttp with the admin's client certificate (or a bearer token), so a
test says exactly what it sends. Paths come from `path_of` (the few kinds the tests
write); anything else goes through `ControlPlane.kubectl`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from tests.cluster.control_plane import ControlPlane

Obj = dict[str, Any]

# kind -> (API prefix, plural, namespaced)
_KINDS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Service": ("/api/v1", "services", True),
    "Pod": ("/api/v1", "pods", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Secret": ("/api/v1", "secrets", True),
    "Endpoints": ("/api/v1", "endpoints", True),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "PeerAuthentication": ("/apis/security.istio.io/v1", "peerauthentications", True),
    "DestinationRule": ("/apis/networking.istio.io/v1", "destinationrules", True),
    "VirtualService": ("/apis/networking.istio.io/v1", "virtualservices", True),
    "Gateway": ("/apis/networking.istio.io/v1", "gateways", True),
    "AuthorizationPolicy": ("/apis/security.istio.io/v1", "authorizationpolicies", True),
    "RequestAuthentication": ("/apis/security.istio.io/v1", "requestauthentications", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
}


class KubeError(AssertionError):
    """The API server refused a request the test expected to succeed."""


def path_of(kind: str, namespace: str = "", name: str = "") -> str:
    """The REST path of a kind's collection (or of one object, given its name)."""
    prefix, plural, namespaced = _KINDS[kind]
    where = f"/namespaces/{namespace}" if namespaced else ""
    return f"{prefix}{where}/{plural}" + (f"/{name}" if name else "")


def _object_path(obj: Obj) -> str:
    meta = obj["metadata"]
    return path_of(obj["kind"], meta.get("namespace", ""), meta["name"])


class Kube:
    """An open session to the API server as one user."""

    def __init__(self, plane: ControlPlane, session: aiohttp.ClientSession) -> None:
        self.plane = plane
        self.session = session

    async def request(
        self, method: str, path: str, body: Obj | None = None, content_type: str = ""
    ) -> tuple[int, Obj]:
        """Any request: the status and the decoded body (empty when none)."""
        headers = {"Content-Type": content_type or "application/json"}
        data = json.dumps(body) if body is not None else None
        async with self.session.request(
            method, self.plane.url + path, data=data, headers=headers
        ) as answer:
            text = await answer.text()
            return answer.status, (json.loads(text) if text.startswith("{") else {})

    async def _ok(
        self, method: str, path: str, body: Obj | None = None, content_type: str = ""
    ) -> Obj:
        status, answer = await self.request(method, path, body, content_type)
        if status >= 300:
            raise KubeError(f"{method} {path}: {status} {answer.get('message', answer)}")
        return answer

    async def get(self, path: str) -> Obj:
        return await self._ok("GET", path)

    async def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return await self._ok("POST", path_of(obj["kind"], meta.get("namespace", "")), obj)

    async def apply(self, obj: Obj) -> Obj:
        """Server-side apply, as `kubectl apply --server-side --force-conflicts`."""
        path = _object_path(obj) + "?fieldManager=pilot-tests&force=true"
        return await self._ok("PATCH", path, obj, "application/apply-patch+yaml")

    async def replace(self, obj: Obj) -> Obj:
        """PUT the whole object (its resourceVersion, when given, must be current)."""
        return await self._ok("PUT", _object_path(obj), obj)

    async def merge_patch(self, path: str, patch: Obj) -> Obj:
        return await self._ok("PATCH", path, patch, "application/merge-patch+json")

    async def delete(self, obj: Obj) -> None:
        status, answer = await self.request("DELETE", _object_path(obj))
        if status >= 300 and status != 404:
            raise KubeError(f"DELETE {_object_path(obj)}: {status} {answer.get('message')}")

    async def token(
        self,
        namespace: str,
        service_account: str,
        audiences: list[str],
        seconds: int = 3600,
        pod: Obj | None = None,
    ) -> str:
        """A bound token from TokenRequest, as the kubelet asks for one (bound to `pod`)."""
        spec: Obj = {"audiences": audiences, "expirationSeconds": seconds}
        if pod is not None:
            meta = pod["metadata"]
            spec["boundObjectRef"] = {
                "kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]
            }  # fmt: skip
        path = path_of("ServiceAccount", namespace, service_account) + "/token"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        answer = await self._ok("POST", path, body)
        token: str = answer["status"]["token"]
        return token


@asynccontextmanager
async def admin(plane: ControlPlane) -> AsyncIterator[Kube]:
    """A session as the cluster's admin (`system:masters`)."""
    connector = aiohttp.TCPConnector(ssl=plane.ssl_context())
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=30)
    ) as session:
        yield Kube(plane, session)
