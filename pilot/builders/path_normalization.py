"""How sidecars' HTTP connection managers normalize request paths (Istio's
`meshConfig.pathNormalization`, set by `PILOT_PATH_NORMALIZATION`).

istiod sets the same three fields on every HTTP connection manager it builds,
inbound and outbound alike (`buildHTTPConnectionManager`):

| mode | normalize_path | merge_slashes | path_with_escaped_slashes_action |
| --- | --- | --- | --- |
| BASE (default) | true | false | KEEP_UNCHANGED |
| MERGE_SLASHES | true | true | KEEP_UNCHANGED |
| DECODE_AND_MERGE_SLASHES | true | true | UNESCAPE_AND_FORWARD |

BASE is RFC 3986 normalization: `.` and `..` segments resolved, percent-encoded
unreserved characters decoded (`%64` is `d`); letter case, `%2F`, `%5C` and
doubled slashes are left as the client sent them. Istio's `NONE` (no
normalization at all) is not offered: authorization paths would then be matched
against whatever the client wrote (`/a/../deny`), so pilot refuses it at start.
"""

from __future__ import annotations

from enum import StrEnum

from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import wrappers_pb2


class PathNormalization(StrEnum):
    """Istio's `meshConfig.pathNormalization.normalization`, less NONE."""

    BASE = "BASE"
    MERGE_SLASHES = "MERGE_SLASHES"
    DECODE_AND_MERGE_SLASHES = "DECODE_AND_MERGE_SLASHES"


_ESCAPED_SLASHES = {
    PathNormalization.BASE: hcm_pb2.HttpConnectionManager.KEEP_UNCHANGED,
    PathNormalization.MERGE_SLASHES: hcm_pb2.HttpConnectionManager.KEEP_UNCHANGED,
    PathNormalization.DECODE_AND_MERGE_SLASHES: hcm_pb2.HttpConnectionManager.UNESCAPE_AND_FORWARD,
}


def normalize_paths(
    manager: hcm_pb2.HttpConnectionManager, mode: PathNormalization
) -> hcm_pb2.HttpConnectionManager:
    """`manager` with istiod's fields for `mode` set (returned for chaining)."""
    manager.normalize_path.CopyFrom(wrappers_pb2.BoolValue(value=True))
    manager.merge_slashes = mode is not PathNormalization.BASE
    manager.path_with_escaped_slashes_action = _ESCAPED_SLASHES[mode]
    return manager
