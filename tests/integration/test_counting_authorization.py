"""AuthorizationPolicy changes, counted: LDS to the sidecars a policy applies to, only.

40 sidecars on delta ADS (CDS `*`, LDS `*`): 20 in namespace `shop` (sidecar i at
the address of service i's endpoint and of its Pod, labelled `app: svc-i`), 20 in
namespaces of their own. Then:
- a policy selecting `app: svc-5` in `shop`: that sidecar alone gets LDS, one
  listener serialized, no cluster;
- a namespace-wide policy in `shop`: the 20 sidecars of `shop` get LDS (two listeners
  serialized: sidecar 5's, and the one the other 19 share), none elsewhere;
- the selecting policy deleted: sidecar 5 alone gets LDS, and reads the shared
  listener again (nothing serialized).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pilot.xds import types
from tests.support.envoy_process import wait_until
from tests.support.inbound_counting import (
    IN_SHOP,
    SELECTED,
    SIDECARS,
    TIMEOUT,
    in_shop,
    next_change,
    sidecar_id,
    sync_inbound,
    workloads,
)
from tests.support.pilot import responses_written, running_pilot
from tests.support.xds_client import XdsClient, node


def _mesh(selecting: bool = False, wide: bool = False) -> list[dict[str, Any]]:
    objects = workloads()
    if selecting:
        selector = {"matchLabels": {"app": f"svc-{SELECTED}"}}
        objects.append(in_shop("AuthorizationPolicy", "one", {"selector": selector, "rules": [{}]}))
    if wide:
        deny = {"action": "DENY", "rules": [{"to": [{}]}]}
        objects.append(in_shop("AuthorizationPolicy", "everyone", deny))
    return objects


async def test_a_policy_change_reaches_the_sidecars_it_applies_to_only(tmp_path: Path) -> None:
    async with running_pilot(tmp_path, _mesh()) as pilot, XdsClient(pilot.grpc_target) as client:
        streams = [client.delta_ads(node(sidecar_id(i))) for i in range(SIDECARS)]
        await asyncio.gather(*(sync_inbound(s) for s in streams))
        stats = pilot.discovery.stats

        stats.reset()
        pilot.write(_mesh(selecting=True))
        assert await next_change(streams[SELECTED]) == (types.LISTENER, {"virtualInbound"}, set())
        assert dict(stats.serializations) == {types.LISTENER: 1}
        await responses_written(stats, {types.LISTENER: 1})
        assert stats.streams_woken == 1

        stats.reset()
        pilot.write(_mesh(selecting=True, wide=True))
        for i in range(IN_SHOP):
            assert await next_change(streams[i]) == (types.LISTENER, {"virtualInbound"}, set())
        assert dict(stats.serializations) == {types.LISTENER: 2}
        await responses_written(stats, {types.LISTENER: IN_SHOP})
        assert stats.streams_woken == IN_SHOP

        stats.reset()
        pilot.write(_mesh(wide=True))
        assert await next_change(streams[SELECTED]) == (types.LISTENER, {"virtualInbound"}, set())
        await wait_until(lambda: stats.responses[types.LISTENER] == 1, TIMEOUT, "one response")
        assert dict(stats.serializations) == {}, "the shared listener was built already"
        await responses_written(stats, {types.LISTENER: 1})
        assert stats.streams_woken == 1
