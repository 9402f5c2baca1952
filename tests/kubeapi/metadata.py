"""Metadata-only lists and watches of the test API server (`PartialObjectMetadata`).

Owns what a client gets when it asks, as client-go's metadata informers do, for
objects' metadata only: `Accept: application/json;as=PartialObjectMetadataList;
g=meta.k8s.io;v=v1` on a list, `...;as=PartialObjectMetadata;...` on a watch.
Alternatives in the header are tried in order, as kube-apiserver does; a plain
`application/json` (or none) means whole objects, and a header naming only
shapes this server cannot serve is 406 Not Acceptable.
"""

from __future__ import annotations

from .store import ApiError, Obj

GROUP_VERSION = "meta.k8s.io/v1"
ITEM_KIND = "PartialObjectMetadata"
LIST_KIND = "PartialObjectMetadataList"


def wants_metadata(accept: str, watch: bool) -> bool:
    """Whether the Accept header asks for metadata only; ApiError 406 if for nothing we serve."""
    if not accept.strip():
        return False
    wanted = ITEM_KIND if watch else LIST_KIND
    for media_range in accept.split(","):
        media_type, *raw_params = (part.strip() for part in media_range.split(";"))
        if media_type not in ("application/json", "application/*", "*/*"):
            continue
        params = dict(p.partition("=")[::2] for p in raw_params)
        shape = params.get("as")
        if shape is None:
            return False
        if (shape, params.get("g"), params.get("v")) == (wanted, "meta.k8s.io", "v1"):
            return True
    raise ApiError(406, "NotAcceptable", f"only the following media types are accepted: {accept}")


def item(obj: Obj) -> Obj:
    """An object (or a bookmark) as PartialObjectMetadata: its metadata, nothing else."""
    return {"kind": ITEM_KIND, "apiVersion": GROUP_VERSION, "metadata": obj.get("metadata", {})}


def list_of(body: Obj) -> Obj:
    """A typed list as PartialObjectMetadataList, same list metadata."""
    return {
        "kind": LIST_KIND,
        "apiVersion": GROUP_VERSION,
        "metadata": body.get("metadata", {}),
        "items": [item(entry) for entry in body.get("items", [])],
    }
