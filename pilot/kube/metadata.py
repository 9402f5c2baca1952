"""Lists and watches that ask the API server for objects' metadata only.

The generated client always asks for whole objects; a Node or a Namespace
carries far more than pilot reads (labels, a name, a deletion time). Asked with
`Accept: ...;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`, the API server
answers with metadata alone, which is what kubectl and client-go's metadata
informers do. The request takes the informer's parameters, as the generated
list functions do; `raw_request` is the same for whole objects of any path
(custom resources, which the generated client has no typed lists for).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client

from pilot.kube.informer import Request

_AS_METADATA = "application/json;as={};g=meta.k8s.io;v=v1,application/json"
_QUERY = {
    "_continue": "continue",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "label_selector": "labelSelector",
    "limit": "limit",
    "resource_version": "resourceVersion",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}


def raw_request(api_client: client.ApiClient, path: str, accept: Callable[[bool], str]) -> Request:
    """List or watch the objects at `path` with the informer's parameters, answered raw;
    `accept(watching)` is the Accept header."""

    async def request(**params: Any) -> Any:
        return await api_client.call_api(
            path,
            "GET",
            query_params=[(_QUERY[k], v) for k, v in params.items() if k in _QUERY],
            header_params={"Accept": accept(bool(params.get("watch")))},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=params.get("_request_timeout"),
        )

    return request


def metadata_only(api_client: client.ApiClient, path: str) -> Request:
    """List or watch the objects at `path` (e.g. /api/v1/nodes) as metadata only."""

    def accept(watching: bool) -> str:
        return _AS_METADATA.format(
            "PartialObjectMetadata" if watching else "PartialObjectMetadataList"
        )

    return raw_request(api_client, path, accept)
