"""PeerAuthentication from the local cluster: Istio's custom resource, listed and watched.

Istio reads its configuration from the config cluster only, so only the local
cluster's registry watches these (remote clusters' never do). The group
`security.istio.io` is looked up at start: `v1` where served, else `v1beta1`.
An API server that serves neither (Istio's CRDs are not installed) answers
404: pilot says so in one warning line and every namespace keeps the mesh
default (PERMISSIVE); installing the CRDs later takes a restart. Any other
failure to ask starts the informer on `v1` anyway, which retries until it lists
and holds readiness back meanwhile: a STRICT namespace is never served as
PERMISSIVE because the API server was slow to answer at start.

Objects are read as raw JSON, through the same informer as every other kind:
one that does not parse is counted and logged as `invalid` and skipped, and
what pilot knew of it stays.
"""

from __future__ import annotations

import logging

from kubernetes_asyncio import client

from pilot.kube.informer import Obj, Request
from pilot.kube.metadata import raw_request
from pilot.registry.peer_authentication import (
    GROUP,
    KIND,
    VERSIONS,
    PeerAuthentication,
    PeerAuthenticationKey,
    PolicyError,
    parse_peer_authentication,
)
from pilot.runtime.supervisor import describe
from pilot.sources.kubernetes.policy_handler import PolicyHandler

log = logging.getLogger("pilot.sources.kubernetes")

PLURAL = "peerauthentications"
_DISCOVERY_BYTES = 1 << 20


def objects_at(api_client: client.ApiClient, path: str) -> Request:
    """List or watch the objects at `path`, whole, with the informer's parameters."""
    return raw_request(api_client, path, lambda _watching: "application/json")


def path_of(version: str, namespace: str | None, plural: str = PLURAL) -> str:
    if namespace is None:
        return f"/apis/{GROUP}/{version}/{plural}"
    return f"/apis/{GROUP}/{version}/namespaces/{namespace}/{plural}"


async def served_version(api_client: client.ApiClient, plural: str = PLURAL) -> str | None:
    """The version to watch: the first of VERSIONS the API server lists the resource in;
    None when it serves none of them (404s); VERSIONS[0] when it could not be asked."""
    for version in VERSIONS:
        try:
            response = await api_client.call_api(
                f"/apis/{GROUP}/{version}",
                "GET",
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=30,
            )
            async with response:
                status = response.status
                body = await response.content.read(_DISCOVERY_BYTES)
        except Exception as error:  # an unreachable API server: the informer will retry
            log.warning("could not ask which %s versions are served: %s", GROUP, describe(error))
            return VERSIONS[0]
        if status == 404:
            continue
        if not 200 <= status < 300:
            return VERSIONS[0]
        if f'"{plural}"'.encode() in body:
            return version
    return None


class PeerAuthenticationHandler(PolicyHandler[PeerAuthentication]):
    """Parses each PeerAuthentication into the updater; a bad one is counted and skipped."""

    def parse(self, obj: Obj) -> PeerAuthentication:
        return parse_peer_authentication(obj)

    def refused(self, obj: Obj, error: BaseException) -> None:
        what = str(error) if isinstance(error, PolicyError) else describe(error)
        self._faults.report(self._cluster, KIND, "invalid", f"an invalid {what}")

    def apply(self, parsed: PeerAuthentication) -> None:
        self._updater.upsert_peer_authentication(parsed)

    def remove(self, namespace: str, name: str) -> None:
        self._updater.delete_peer_authentication(PeerAuthenticationKey(namespace, name))
