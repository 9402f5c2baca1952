"""PILOT_PATH_NORMALIZATION: what each mode sets on sidecars' connection managers, inbound
and outbound, as istiod sets them; NONE and junk refused."""

from __future__ import annotations

import pytest
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from pilot.builders.inbound import InboundProtocol, InboundShape, virtual_inbound
from pilot.builders.listeners import outbound_listener
from pilot.builders.path_normalization import PathNormalization
from pilot.registry.peer_authentication import MtlsMode
from pilot.settings import SettingsError, path_normalization_from_env
from pilot.xds.interception import Interception

KEEP = hcm_pb2.HttpConnectionManager.KEEP_UNCHANGED
UNESCAPE = hcm_pb2.HttpConnectionManager.UNESCAPE_AND_FORWARD
EXPECTED = {  # istiod's buildHTTPConnectionManager: (merge_slashes, escaped slashes)
    PathNormalization.BASE: (False, KEEP),
    PathNormalization.MERGE_SLASHES: (True, KEEP),
    PathNormalization.DECODE_AND_MERGE_SLASHES: (True, UNESCAPE),
}


def _managers(listener: object) -> list[hcm_pb2.HttpConnectionManager]:
    found = []
    for chain in listener.filter_chains:  # type: ignore[attr-defined]
        for f in chain.filters:
            if f.name == "envoy.filters.network.http_connection_manager":
                manager = hcm_pb2.HttpConnectionManager()
                f.typed_config.Unpack(manager)
                found.append(manager)
    return found


@pytest.mark.parametrize("mode", list(PathNormalization))
def test_inbound_and_outbound_managers_normalize_as_istiod(mode: PathNormalization) -> None:
    shape = InboundShape(((9080, InboundProtocol.HTTP),), MtlsMode.PERMISSIVE)
    inbound = _managers(virtual_inbound(shape, mode))
    outbound = _managers(
        outbound_listener(Interception.REDIRECT, "10.0.0.1", 80, "c", True, normalization=mode)
    )
    assert len(inbound) == 2 and len(outbound) == 1  # mTLS and plaintext chains; one route
    for manager in inbound + outbound:
        assert manager.normalize_path.value is True
        assert (manager.merge_slashes, manager.path_with_escaped_slashes_action) == EXPECTED[mode]


@pytest.mark.parametrize(
    ("raw", "mode"),
    [
        (None, PathNormalization.BASE),
        ("BASE", PathNormalization.BASE),
        ("merge_slashes", PathNormalization.MERGE_SLASHES),
        (" DECODE_AND_MERGE_SLASHES ", PathNormalization.DECODE_AND_MERGE_SLASHES),
    ],
)
def test_the_variable_names_a_mode(raw: str | None, mode: PathNormalization) -> None:
    env = {} if raw is None else {"PILOT_PATH_NORMALIZATION": raw}
    assert path_normalization_from_env(env) is mode


@pytest.mark.parametrize("raw", ["NONE", "none", "", "DEFAULT", "BASE\nX", "x" * 10_000, "B\x00"])
def test_none_and_junk_are_refused_in_one_line(raw: str) -> None:
    with pytest.raises(SettingsError) as refused:
        path_normalization_from_env({"PILOT_PATH_NORMALIZATION": raw})
    line = str(refused.value)
    assert line.startswith("PILOT_PATH_NORMALIZATION: expected BASE, MERGE_SLASHES")
    assert "\n" not in line.replace("\\n", "") and len(line) < 300
    if raw.upper() == "NONE":
        assert "unnormalized" in line
