"""RequestAuthentication changes, counted: LDS (and CDS for a jwksUri's cluster) to the
sidecars it applies to, only.

40 sidecars on delta ADS (CDS `*`, LDS `*`): 20 in namespace `shop` (sidecar i at the
address of service i's endpoint and of its Pod, labelled `app: svc-i`), 20 in namespaces
of their own; the objects come from the registry file. Then:
- a RequestAuthentication (inline jwks) selecting `app: svc-5`: that sidecar alone gets
  LDS, one listener serialized, no cluster;
- its rule given a jwksUri instead: sidecar 5 alone gets its listener and the cluster
  for that URI (CDS), nobody else anything;
- a namespace-wide one in `shop`: the 20 sidecars of `shop` get LDS, none elsewhere;
- the selecting one deleted: sidecar 5 alone gets LDS and CDS (its JWKS cluster gone).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pilot.xds import types
from tests.support.inbound_counting import (
    IN_SHOP,
    SELECTED,
    SIDECARS,
    in_shop,
    next_change,
    sidecar_id,
    sync_inbound,
    workloads,
)
from tests.support.jwt_tokens import ISSUER, SigningKey
from tests.support.pilot import responses_written, running_pilot
from tests.support.xds_client import XdsClient, node

JWKS = SigningKey().jwks()
JWKS_CLUSTER = "jwks|https|keys.example.com|443"


def _mesh(selecting: str = "", wide: bool = False) -> list[dict[str, Any]]:
    objects = workloads()
    if selecting:
        keys = (
            {"jwks": JWKS} if selecting == "inline" else {"jwksUri": "https://keys.example.com/k"}
        )
        rule = {"issuer": ISSUER, **keys}
        selector = {"matchLabels": {"app": f"svc-{SELECTED}"}}
        spec = {"selector": selector, "jwtRules": [rule]}
        objects.append(in_shop("RequestAuthentication", "one", spec))
    if wide:
        rule = {"issuer": "https://wide.example.com", "jwks": JWKS}
        objects.append(in_shop("RequestAuthentication", "everyone", {"jwtRules": [rule]}))
    return objects


async def test_a_request_authentication_change_reaches_the_sidecars_it_applies_to_only(
    tmp_path: Path,
) -> None:
    async with running_pilot(tmp_path, _mesh()) as pilot, XdsClient(pilot.grpc_target) as client:
        streams = [client.delta_ads(node(sidecar_id(i))) for i in range(SIDECARS)]
        await asyncio.gather(*(sync_inbound(s) for s in streams))
        stats = pilot.discovery.stats

        stats.reset()
        pilot.write(_mesh(selecting="inline"))
        assert await next_change(streams[SELECTED]) == (types.LISTENER, {"virtualInbound"}, set())
        assert dict(stats.serializations) == {types.LISTENER: 1}
        await responses_written(stats, {types.LISTENER: 1})
        assert stats.streams_woken == 1

        stats.reset()
        pilot.write(_mesh(selecting="remote"))
        got = [await next_change(streams[SELECTED]) for _ in range(2)]
        assert sorted(got) == [
            (types.CLUSTER, {JWKS_CLUSTER}, set()),
            (types.LISTENER, {"virtualInbound"}, set()),
        ]
        await responses_written(stats, {types.LISTENER: 1, types.CLUSTER: 1})
        assert stats.streams_woken == 1

        stats.reset()
        pilot.write(_mesh(selecting="remote", wide=True))
        for i in range(IN_SHOP):
            assert await next_change(streams[i]) == (types.LISTENER, {"virtualInbound"}, set())
        await responses_written(stats, {types.LISTENER: IN_SHOP})
        assert stats.streams_woken == IN_SHOP

        stats.reset()
        pilot.write(_mesh(wide=True))
        got = [await next_change(streams[SELECTED]) for _ in range(2)]
        assert sorted(got) == [
            (types.CLUSTER, set(), {JWKS_CLUSTER}),
            (types.LISTENER, {"virtualInbound"}, set()),
        ]
        await responses_written(stats, {types.LISTENER: 1, types.CLUSTER: 1})
        assert stats.streams_woken == 1
