"""Incremental (delta) conformance (DeltaAggregatedResources, DeltaClusters, DeltaEndpoints).

Checks, on the wire, the "Incremental / delta" rules of the protocol checklist
(shared/xds-protocol.md) and the delta side of "Both variants": subscribe and
unsubscribe, every subscribed name answered, missing names in
`removed_resources`, `initial_resource_versions` on reconnect, wildcard (`*`
and legacy), per-resource versions, empty assignments, and EDS after CDS.

A test that asserts "nothing was sent" never sleeps: it provokes a second,
distinguishable response and asserts that this is the next one to arrive.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.protocol.registry import GHOST, A, B, C, D, Registry
from tests.support.pilot import RunningPilot
from tests.support.xds_client import (
    CLUSTER,
    ENDPOINT,
    DeltaResponse,
    DeltaStream,
    XdsClient,
    endpoint_ips,
)

Opener = Callable[[XdsClient], DeltaStream]

CDS_OPENERS: dict[str, Opener] = {"ads": XdsClient.delta_ads, "standalone": XdsClient.delta_cds}
EDS_OPENERS: dict[str, Opener] = {"ads": XdsClient.delta_ads, "standalone": XdsClient.delta_eds}


async def expect_delta(
    stream: DeltaStream,
    type_url: str,
    updated: set[str] | None = None,
    removed: set[str] | None = None,
) -> DeltaResponse:
    """The next response must be of this type, update exactly `updated` and remove exactly
    `removed` (either left None: not checked); it is applied and ACKed."""
    response = await stream.expect(type_url)
    if updated is not None:
        assert {r.name for r in response.resources} == updated, "unexpected updated set"
    if removed is not None:
        assert set(response.removed_resources) == removed, "unexpected removed set"
    await stream.ack(response)
    return response


async def subscribed(
    xds: XdsClient, eds: list[str], opener: Opener = XdsClient.delta_ads
) -> DeltaStream:
    """A delta stream subscribed to EDS `eds`, first response received and ACKed."""
    stream = opener(xds)
    await stream.subscribe(ENDPOINT, eds)
    await expect_delta(stream, ENDPOINT)
    return stream


def ips_held(stream: DeltaStream, name: str) -> set[str]:
    return endpoint_ips(stream.held[ENDPOINT][name].message)


# --------------------------------------------------------------------------- subscribe


@pytest.mark.parametrize("opener", EDS_OPENERS.values(), ids=EDS_OPENERS.keys())
async def test_subscribe_answers_every_name(
    xds: XdsClient, registry: Registry, opener: Opener
) -> None:
    stream = opener(xds)
    await stream.subscribe(ENDPOINT, [A, B])
    await expect_delta(stream, ENDPOINT, updated={A, B}, removed=set())
    assert ips_held(stream, A) == registry.ips(A)
    assert ips_held(stream, B) == registry.ips(B)


async def test_subscribing_again_to_a_held_name_is_answered(xds: XdsClient) -> None:
    stream = await subscribed(xds, [A])
    await stream.subscribe(ENDPOINT, [A])
    await expect_delta(stream, ENDPOINT, updated={A}, removed=set())


async def test_subscribe_adds_to_the_subscription(xds: XdsClient, registry: Registry) -> None:
    stream = await subscribed(xds, [A])
    await stream.subscribe(ENDPOINT, [B])
    await expect_delta(stream, ENDPOINT, updated={B}, removed=set())
    registry.endpoints["a"] = ["10.0.1.20"]
    registry.endpoints["b"] = ["10.0.2.20"]
    await registry.write()
    await expect_delta(stream, ENDPOINT, updated={A, B}, removed=set())


async def test_missing_name_is_removed_and_pushed_when_it_appears(
    xds: XdsClient, registry: Registry
) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(ENDPOINT, [A, GHOST])
    await expect_delta(stream, ENDPOINT, updated={A}, removed={GHOST})
    registry.endpoints["ghost"] = ["10.0.6.1"]
    await registry.write()
    await expect_delta(stream, ENDPOINT, updated={GHOST}, removed=set())
    assert ips_held(stream, GHOST) == {"10.0.6.1"}


async def test_subscribing_again_to_a_missing_name_is_answered(xds: XdsClient) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(ENDPOINT, [GHOST])
    await expect_delta(stream, ENDPOINT, updated=set(), removed={GHOST})
    await stream.subscribe(ENDPOINT, [GHOST])
    await expect_delta(stream, ENDPOINT, updated=set(), removed={GHOST})


# --------------------------------------------------------------------------- unsubscribe


async def test_pure_unsubscribe_gets_no_response(xds: XdsClient) -> None:
    stream = await subscribed(xds, [A, B])
    await stream.unsubscribe(ENDPOINT, [A])
    await stream.subscribe(ENDPOINT, [C])
    await expect_delta(stream, ENDPOINT, updated={C}, removed=set())


async def test_unsubscribed_name_is_no_longer_pushed(xds: XdsClient, registry: Registry) -> None:
    stream = await subscribed(xds, [A, B])
    await stream.unsubscribe(ENDPOINT, [A])
    registry.endpoints["a"] = ["10.0.1.21"]
    registry.endpoints["b"] = ["10.0.2.21"]
    await registry.write()
    await expect_delta(stream, ENDPOINT, updated={B}, removed=set())


async def test_unsubscribe_of_a_never_held_name_is_ignored(xds: XdsClient) -> None:
    stream = await subscribed(xds, [A])
    await stream.unsubscribe(ENDPOINT, [B, GHOST])
    await stream.subscribe(ENDPOINT, [C])
    await expect_delta(stream, ENDPOINT, updated={C}, removed=set())


async def test_resubscribe_after_unsubscribe_is_answered(xds: XdsClient) -> None:
    stream = await subscribed(xds, [A])
    await stream.unsubscribe(ENDPOINT, [A])
    await stream.subscribe(ENDPOINT, [A])
    await expect_delta(stream, ENDPOINT, updated={A}, removed=set())


# --------------------------------------------------------------------------- wildcard


@pytest.mark.parametrize("names", [[], ["*"]], ids=["legacy-wildcard", "star"])
@pytest.mark.parametrize("opener", CDS_OPENERS.values(), ids=CDS_OPENERS.keys())
async def test_wildcard_gets_every_cluster_and_follows_changes(
    xds: XdsClient, registry: Registry, opener: Opener, names: list[str]
) -> None:
    stream = opener(xds)
    await stream.subscribe(CLUSTER, names)
    await expect_delta(stream, CLUSTER, updated={A, B, C}, removed=set())
    registry.endpoints["d"] = ["10.0.4.1"]
    await registry.write()
    await expect_delta(stream, CLUSTER, updated={D}, removed=set())
    del registry.endpoints["b"]
    await registry.write()
    await expect_delta(stream, CLUSTER, updated=set(), removed={B})


@pytest.mark.parametrize("names", [[], ["*"]], ids=["legacy-wildcard", "star"])
async def test_unsubscribing_star_leaves_wildcard(
    xds: XdsClient, registry: Registry, names: list[str]
) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(CLUSTER, names)
    await expect_delta(stream, CLUSTER, updated={A, B, C})
    watcher = xds.delta_ads()
    await watcher.subscribe(CLUSTER, ["*"])
    await expect_delta(watcher, CLUSTER, updated={A, B, C})
    await stream.unsubscribe(CLUSTER, ["*"])
    registry.endpoints["d"] = ["10.0.4.1"]
    await registry.write()
    await expect_delta(watcher, CLUSTER, updated={D})  # the push went out
    await stream.subscribe(CLUSTER, [A])
    # Whatever the server says about clusters held only through `*`, D is not pushed.
    while True:
        response = await expect_delta(stream, CLUSTER)
        updated = {r.name for r in response.resources}
        assert D not in updated, "a new cluster was pushed after leaving the wildcard"
        if A in updated:
            break


async def test_star_with_explicit_names_is_both(xds: XdsClient, registry: Registry) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(CLUSTER, ["*", GHOST])
    await expect_delta(stream, CLUSTER, updated={A, B, C}, removed={GHOST})
    registry.endpoints["ghost"] = ["10.0.6.1"]
    await registry.write()
    await expect_delta(stream, CLUSTER, updated={GHOST}, removed=set())


async def test_unsubscribing_a_name_also_in_the_wildcard_resends_it(xds: XdsClient) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(CLUSTER, ["*"])
    await expect_delta(stream, CLUSTER, updated={A, B, C})
    await stream.subscribe(CLUSTER, [A])
    await expect_delta(stream, CLUSTER, updated={A})
    await stream.unsubscribe(CLUSTER, [A])
    # The client cannot know whether A is still wanted through `*`: tell it.
    await expect_delta(stream, CLUSTER, updated={A}, removed=set())


# --------------------------------------------------------------------------- reconnect


async def test_reconnect_with_initial_resource_versions_sends_only_the_differences(
    xds: XdsClient, registry: Registry
) -> None:
    first = await subscribed(xds, [A, B, C])
    held = first.versions(ENDPOINT)
    assert set(held) == {A, B, C}
    await first.close()
    watcher = await subscribed(xds, [B, C])
    registry.endpoints["b"] = ["10.0.2.30"]
    del registry.endpoints["c"]
    await registry.write()
    await expect_delta(watcher, ENDPOINT, updated={B}, removed={C})  # pilot has applied it
    second = xds.delta_ads()
    await second.request(ENDPOINT, subscribe=[A, B, C], initial_versions=held)
    # A probe that must be answered; everything the reconnect owed comes before or with it.
    await second.subscribe(ENDPOINT, [GHOST])
    updated: set[str] = set()
    removed: set[str] = set()
    while GHOST not in removed:
        response = await expect_delta(second, ENDPOINT)
        updated |= {r.name for r in response.resources}
        removed |= set(response.removed_resources)
    assert updated == {B}, "A was held at its current version; only B changed"
    assert removed == {C, GHOST}
    assert ips_held(second, B) == {"10.0.2.30"}


async def test_wildcard_reconnect_with_initial_resource_versions(
    xds: XdsClient, registry: Registry
) -> None:
    first = xds.delta_cds()
    await first.subscribe(CLUSTER, ["*"])
    await expect_delta(first, CLUSTER, updated={A, B, C})
    held = first.versions(CLUSTER)
    await first.close()
    watcher = xds.delta_ads()
    await watcher.subscribe(CLUSTER, ["*"])
    await expect_delta(watcher, CLUSTER, updated={A, B, C})
    registry.grpc.add("a")
    del registry.endpoints["c"]
    await registry.write()
    await expect_delta(watcher, CLUSTER, updated={A}, removed={C})
    second = xds.delta_cds()
    await second.request(CLUSTER, subscribe=["*"], initial_versions=held)
    await expect_delta(second, CLUSTER, updated={A}, removed={C})


# --------------------------------------------------------------------------- changes


@pytest.mark.parametrize("gone", [[], None], ids=["empty-slice", "no-slice"])
async def test_endpoints_dropping_to_zero_send_an_empty_assignment_not_a_removal(
    xds: XdsClient, registry: Registry, gone: list[str] | None
) -> None:
    stream = await subscribed(xds, [A])
    registry.endpoints["a"] = gone
    await registry.write()
    await expect_delta(stream, ENDPOINT, updated={A}, removed=set())
    assert ips_held(stream, A) == set()


async def test_deleted_service_is_removed(xds: XdsClient, registry: Registry) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(CLUSTER, ["*"])
    await expect_delta(stream, CLUSTER, updated={A, B, C})
    await stream.subscribe(ENDPOINT, [A, B])
    await expect_delta(stream, ENDPOINT, updated={A, B})
    del registry.endpoints["a"]
    await registry.write()
    await expect_delta(stream, CLUSTER, updated=set(), removed={A})
    await expect_delta(stream, ENDPOINT, updated=set(), removed={A})


async def test_rewrite_with_identical_content_sends_nothing(
    xds: XdsClient, registry: Registry
) -> None:
    stream = await subscribed(xds, [A, B])
    await registry.write()
    registry.endpoints["b"] = ["10.0.2.2"]
    await registry.write()
    await expect_delta(stream, ENDPOINT, updated={B}, removed=set())


async def test_endpoint_change_sends_eds_and_no_cds(xds: XdsClient, registry: Registry) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(CLUSTER, ["*"])
    await expect_delta(stream, CLUSTER, updated={A, B, C})
    await stream.subscribe(ENDPOINT, [A, B])
    await expect_delta(stream, ENDPOINT, updated={A, B})
    registry.unready["b"] = ["10.0.2.99"]  # changes no resource
    registry.endpoints["a"] = ["10.0.1.26"]
    await registry.write()
    await expect_delta(stream, ENDPOINT, updated={A}, removed=set())
    registry.endpoints["d"] = ["10.0.4.1"]
    await registry.write()
    await expect_delta(stream, CLUSTER, updated={D}, removed=set())


async def test_endpoint_change_reaches_only_streams_subscribed_to_it(
    xds: XdsClient, registry: Registry
) -> None:
    on_a = await subscribed(xds, [A])
    on_b = await subscribed(xds, [B])
    registry.endpoints["a"] = ["10.0.1.22"]
    await registry.write()
    await expect_delta(on_a, ENDPOINT, updated={A})
    registry.endpoints["b"] = ["10.0.2.22"]
    await registry.write()
    await expect_delta(on_b, ENDPOINT, updated={B}, removed=set())


async def test_cds_push_is_followed_by_eds_for_the_clusters_it_carried(
    xds: XdsClient, registry: Registry
) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(CLUSTER, ["*"])
    await expect_delta(stream, CLUSTER, updated={A, B, C})
    await stream.subscribe(ENDPOINT, [A, B])
    await expect_delta(stream, ENDPOINT, updated={A, B})
    registry.grpc.add("a")  # changes cluster A, not its endpoints
    await registry.write()
    await expect_delta(stream, CLUSTER, updated={A}, removed=set())
    await expect_delta(stream, ENDPOINT, updated={A}, removed=set())


async def test_pushes_are_ordered_cds_before_eds(xds: XdsClient, registry: Registry) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(CLUSTER, ["*"])
    await expect_delta(stream, CLUSTER, updated={A, B, C})
    await stream.subscribe(ENDPOINT, [A, D])
    await expect_delta(stream, ENDPOINT, updated={A}, removed={D})
    registry.endpoints["d"] = ["10.0.4.1"]
    registry.endpoints["a"] = ["10.0.1.23"]
    await registry.write()
    await expect_delta(stream, CLUSTER, updated={D})
    await expect_delta(stream, ENDPOINT, updated={A, D})


async def test_removals_come_after_the_additions_of_the_same_push(
    xds: XdsClient, registry: Registry
) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(CLUSTER, ["*"])
    await expect_delta(stream, CLUSTER, updated={A, B, C})
    await stream.subscribe(ENDPOINT, [A, B, D])
    await expect_delta(stream, ENDPOINT, updated={A, B}, removed={D})
    del registry.endpoints["b"]
    registry.endpoints["d"] = ["10.0.4.1"]
    await registry.write()
    # The push: D added to CDS and EDS, B removed from CDS and EDS, in whatever responses.
    owed = {("+", CLUSTER, D), ("+", ENDPOINT, D), ("-", CLUSTER, B), ("-", ENDPOINT, B)}
    pushed: list[set[tuple[str, str, str]]] = []
    while not owed <= set().union(*pushed):
        response = await stream.next_response()
        await stream.ack(response)
        t = response.type_url
        pushed.append(
            {("+", t, r.name) for r in response.resources}
            | {("-", t, name) for name in response.removed_resources}
        )
    last_addition = max(i for i, items in enumerate(pushed) if any(k == "+" for k, _, _ in items))
    first_removal = min(i for i, items in enumerate(pushed) if any(k == "-" for k, _, _ in items))
    order = [sorted(f"{k}{t.rsplit('.', 1)[-1]} {n}" for k, t, n in items) for items in pushed]
    assert first_removal >= last_addition, f"a removal went out before an addition: {order}"


# --------------------------------------------------------------------------- ACK / NACK / nonces


async def test_nack_is_recorded_and_the_rejected_version_not_resent(
    xds: XdsClient, pilot: RunningPilot
) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(ENDPOINT, [A])
    await stream.nack(await stream.expect(ENDPOINT), "eds: bad assignment")
    await stream.subscribe(ENDPOINT, [C])
    await expect_delta(stream, ENDPOINT, updated={C}, removed=set())
    assert pilot.discovery.stats.nacks[ENDPOINT] == 1


async def test_stale_nonce_still_changes_the_subscription(
    xds: XdsClient, registry: Registry
) -> None:
    stream = xds.delta_ads()
    await stream.subscribe(ENDPOINT, [A])
    first = await expect_delta(stream, ENDPOINT, updated={A})
    registry.endpoints["a"] = ["10.0.1.24"]
    await registry.write()
    await expect_delta(stream, ENDPOINT, updated={A})
    await stream.request(ENDPOINT, subscribe=[B], unsubscribe=[A], nonce=first.nonce)
    await expect_delta(stream, ENDPOINT, updated={B}, removed=set())
    registry.endpoints["a"] = ["10.0.1.25"]
    registry.endpoints["b"] = ["10.0.2.25"]
    await registry.write()
    await expect_delta(stream, ENDPOINT, updated={B}, removed=set())


# --------------------------------------------------------------------------- model check

POOL = [A, B, GHOST]
PROBE = C

Op = tuple[str, list[str]]
OPS = st.tuples(
    st.sampled_from(["subscribe", "unsubscribe", "endpoints", "delete", "restore"]),
    st.lists(st.sampled_from(POOL), min_size=1, max_size=3),
)


async def apply_registry_op(registry: Registry, watcher: DeltaStream, op: Op) -> None:
    """Change the registry for one name of the op and wait until a watcher saw the push."""
    kind, names = op
    service = {A: "a", B: "b", GHOST: "ghost"}[names[0]]
    exists = service in registry.endpoints
    if kind == "delete" and exists:
        del registry.endpoints[service]
    elif (kind == "restore" and not exists) or (kind == "endpoints" and exists):
        registry.renumber(service)  # creates it, or moves its endpoint
    else:
        return  # nothing would change: no push to wait for
    await registry.write()
    await expect_delta(watcher, ENDPOINT)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(OPS, min_size=1, max_size=8))
async def test_random_subscriptions_and_changes_keep_the_client_view_exact(
    xds: XdsClient, registry: Registry, ops: list[Op]
) -> None:
    """After any mix of subscribe, unsubscribe and registry changes, the client holds
    exactly the current assignment of every subscribed name that exists, and
    nothing for a subscribed name that does not."""
    watcher = xds.delta_ads()
    await watcher.subscribe(ENDPOINT, POOL)
    await expect_delta(watcher, ENDPOINT)
    stream = xds.delta_ads()
    await stream.subscribe(ENDPOINT, [PROBE])
    await expect_delta(stream, ENDPOINT, updated={PROBE})
    wanted: set[str] = set()
    try:
        for op in ops:
            kind, names = op
            if kind == "subscribe":
                await stream.subscribe(ENDPOINT, names)
                wanted |= set(names)
            elif kind == "unsubscribe":
                await stream.unsubscribe(ENDPOINT, names)
                wanted -= set(names)
            else:
                await apply_registry_op(registry, watcher, op)
            # Probe: a resubscribe after unsubscribe must be answered; anything the step
            # owed comes before it or with it.
            await stream.unsubscribe(ENDPOINT, [PROBE])
            await stream.subscribe(ENDPOINT, [PROBE])
            while True:
                response = await expect_delta(stream, ENDPOINT)
                if PROBE in {r.name for r in response.resources}:
                    break
            view = {n: endpoint_ips(h.message) for n, h in stream.held[ENDPOINT].items()}
            view.pop(PROBE, None)
            expected = {n: registry.ips(n) for n in wanted if registry.ips(n) is not None}
            assert {n: ips for n, ips in view.items() if n in wanted} == expected
    finally:
        await stream.close()
        await watcher.close()
