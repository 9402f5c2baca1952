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
from tests.support.jwt_tokens import ISSUER, SigningKey
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import responses_written, running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

IN_SHOP = 20
ELSEWHERE = 20
TIMEOUT = 30.0
SELECTED = 5
JWKS = SigningKey().jwks()
JWKS_CLUSTER = "jwks|https|keys.example.com|443"


def _ip(i: int) -> str:
    return f"127.1.{i // 250}.{1 + i % 250}"


def _namespace(i: int) -> str:
    return "shop" if i < IN_SHOP else f"ns-{i}"


def _sidecar(i: int) -> str:
    ns = _namespace(i)
    return f"sidecar~{_ip(i)}~pod-{i}.{ns}~{ns}.svc.cluster.local"


def _request_authentication(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": spec,
    }


def _mesh(selecting: str = "", wide: bool = False) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for i in range(IN_SHOP + ELSEWHERE):
        ns = _namespace(i)
        objects += [
            service(f"svc-{i:03d}", ns),
            endpoint_slice(f"svc-{i:03d}", [Ep(_ip(i))], ns, name=f"svc-{i:03d}-1"),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"pod-{i}", "namespace": ns, "labels": {"app": f"svc-{i}"}},
                "spec": {"containers": [{"name": "app"}]},
                "status": {"phase": "Running", "podIP": _ip(i)},
            },
        ]
    if selecting:
        keys = (
            {"jwks": JWKS} if selecting == "inline" else {"jwksUri": "https://keys.example.com/k"}
        )
        rule = {"issuer": ISSUER, **keys}
        selector = {"matchLabels": {"app": f"svc-{SELECTED}"}}
        objects.append(_request_authentication("one", {"selector": selector, "jwtRules": [rule]}))
    if wide:
        rule = {"issuer": "https://wide.example.com", "jwks": JWKS}
        objects.append(_request_authentication("everyone", {"jwtRules": [rule]}))
    return objects


async def _sync(stream: DeltaStream) -> None:
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.LISTENER, ["*"])
    held: set[str] = set()
    while not {"virtualInbound", "inbound|8080||"} <= held:
        response = await stream.next_response(TIMEOUT)
        held |= set(delta_resources(response))
        await stream.ack(response)


async def _next(stream: DeltaStream) -> tuple[str, set[str], set[str]]:
    """One response: its type, the names it sends and those it removes."""
    response = await stream.next_response(TIMEOUT)
    await stream.ack(response)
    return response.type_url, set(delta_resources(response)), set(response.removed_resources)


async def test_a_request_authentication_change_reaches_the_sidecars_it_applies_to_only(
    tmp_path: Path,
) -> None:
    async with running_pilot(tmp_path, _mesh()) as pilot, XdsClient(pilot.grpc_target) as client:
        streams = [client.delta_ads(node(_sidecar(i))) for i in range(IN_SHOP + ELSEWHERE)]
        await asyncio.gather(*(_sync(s) for s in streams))
        stats = pilot.discovery.stats

        stats.reset()
        pilot.write(_mesh(selecting="inline"))
        assert await _next(streams[SELECTED]) == (types.LISTENER, {"virtualInbound"}, set())
        assert dict(stats.serializations) == {types.LISTENER: 1}
        await responses_written(stats, {types.LISTENER: 1})
        assert stats.streams_woken == 1

        stats.reset()
        pilot.write(_mesh(selecting="remote"))
        got = [await _next(streams[SELECTED]) for _ in range(2)]
        assert sorted(got) == [
            (types.CLUSTER, {JWKS_CLUSTER}, set()),
            (types.LISTENER, {"virtualInbound"}, set()),
        ]
        await responses_written(stats, {types.LISTENER: 1, types.CLUSTER: 1})
        assert stats.streams_woken == 1

        stats.reset()
        pilot.write(_mesh(selecting="remote", wide=True))
        for i in range(IN_SHOP):
            assert await _next(streams[i]) == (types.LISTENER, {"virtualInbound"}, set())
        await responses_written(stats, {types.LISTENER: IN_SHOP})
        assert stats.streams_woken == IN_SHOP

        stats.reset()
        pilot.write(_mesh(wide=True))
        got = [await _next(streams[SELECTED]) for _ in range(2)]
        assert sorted(got) == [
            (types.CLUSTER, set(), {JWKS_CLUSTER}),
            (types.LISTENER, {"virtualInbound"}, set()),
        ]
        await responses_written(stats, {types.LISTENER: 1, types.CLUSTER: 1})
        assert stats.streams_woken == 1
